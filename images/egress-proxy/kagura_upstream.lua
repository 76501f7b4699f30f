-- The model endpoint's side of the key-injecting port (kagura_model_port.lua calls it):
-- which requests are model calls of the run's endpoint API, where each goes upstream,
-- which body fields and betas that API takes, and how the operator's credential goes
-- with it. One table per API, as the Claude Code CLI speaks it:
--
--   anthropic  POST /v1/messages, /v1/messages/count_tokens (query: beta=true), to the
--              endpoint's base path (a gateway's /anthropic); the key as x-api-key, or as
--              Authorization: Bearer (a gateway's key, a subscription's OAuth token: the
--              oauth beta goes with it).
--   bedrock    POST /model/{model}/invoke and /invoke-with-response-stream; the betas are
--              in the body's anthropic_beta too; every call signed here with AWS Signature
--              Version 4 (service bedrock, the endpoint's region) from the leased STS key,
--              through LuaJIT's FFI to the image's OpenSSL (HMAC-SHA256, SHA-256). The
--              CLI's inference-profile discovery (GET /inference-profiles, a control-plane
--              call it sends to the same base URL) is answered here with an empty list, so
--              the CLI uses the model id the plan names; nothing goes upstream for it.
--   vertex     POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/
--              {model}:rawPredict|:streamRawPredict and .../count-tokens:rawPredict, for the
--              endpoint's project and region only; the leased token as Authorization:
--              Bearer. The CLI sends web-search's beta on every Vertex call: a feature
--              beta the policy does not allow is dropped from the call here rather than
--              refused (the call carries no server tool: those are refused on their own).
--
-- The credential is read from its file on every request: a leased one is renewed while
-- the run goes on (modelport.set_key writes the file).

local ffi = require "ffi"

local M = {}

local API, AUTH, BASE_PATH, REGION, PROJECT, HOST = "anthropic", "x-api-key", "", nil, nil, "-"
local DROP = {}  -- beta families dropped rather than refused (vertex)
local OAUTH_BETA = "oauth-2025-04-20"

ffi.cdef [[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_sha256(void);
unsigned char *HMAC(const EVP_MD *evp_md, const void *key, int key_len,
                    const unsigned char *d, size_t n, unsigned char *md,
                    unsigned int *md_len);
unsigned char *SHA256(const unsigned char *d, size_t n, unsigned char *md);
]]
local crypto = nil
local digest = ffi.new("unsigned char[32]")
local digest_len = ffi.new("unsigned int[1]")

local function hmac(key, data)
    crypto.HMAC(crypto.EVP_sha256(), key, #key, data, #data, digest, digest_len)
    return ffi.string(digest, digest_len[0])
end

local function sha256_hex(data)
    crypto.SHA256(data, #data, digest)
    local raw = ffi.string(digest, 32)
    return (raw:gsub(".", function(c) return string.format("%02x", string.byte(c)) end))
end

local function hex(raw)
    return (raw:gsub(".", function(c) return string.format("%02x", string.byte(c)) end))
end

function M.init(policy)
    API = policy.api or "anthropic"
    AUTH = policy.auth or "x-api-key"
    BASE_PATH = policy.base_path or ""
    REGION = policy.region
    PROJECT = policy.project
    HOST = policy.upstream_host or "-"
    for _, family in ipairs(policy.drop_beta_families or {}) do DROP[family] = true end
    if AUTH == "sigv4" then crypto = ffi.load("libcrypto.so.3") end
end

function M.api() return API end

-- ---------------------------------------------------------------------------------
-- the credential

--- The credential in force and the strings never to be shown back (nil when unreadable).
function M.read_key(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local key = (f:read("*a") or ""):gsub("[\r\n]+$", "")
    f:close()
    -- "withdrawn": the lease's budget ran out (apply/midrun/injected.py); no call carries one.
    if key == "" or key == "withdrawn" or not key:match("^[A-Za-z0-9._~+/=:-]+$") then
        return nil
    end
    if AUTH ~= "sigv4" then return { value = key, secrets = { key } } end
    local id, secret, token = key:match("^([A-Z0-9]+):([^:]+):([^:]+)$")
    if not id then return nil end
    return { id = id, secret = secret, token = token, secrets = { secret, token } }
end

-- ---------------------------------------------------------------------------------
-- 1. which requests are model calls

local MESSAGE_PATHS = { ["/v1/messages"] = "message", ["/v1/messages/count_tokens"] = "free" }
local MODEL_ID = "^[A-Za-z0-9][A-Za-z0-9._:-]*$"
local VERTEX_MODEL = "^[A-Za-z0-9][A-Za-z0-9._@-]*$"

--- (class, upstream target) of a request, or nil: class is message, free or local (the
--- port answers it itself). ``path`` is as sent (the caller refused any encoding in it).
function M.classify(method, path, query)
    if API == "bedrock" then
        if method == "GET" and path == "/inference-profiles" then return "local", nil end
        local model, op = path:match("^/model/([^/]+)/([a-z-]+)$")
        if method ~= "POST" or query ~= "" or not model or #model > 256
            or not model:match(MODEL_ID)
            or (op ~= "invoke" and op ~= "invoke-with-response-stream") then
            return nil
        end
        -- ':' percent-encoded upstream, as AWS's own SDKs send a model id.
        local encoded = model:gsub(":", "%%3A")
        return "message", BASE_PATH .. "/model/" .. encoded .. "/" .. op
    end
    if API == "vertex" then
        if method ~= "POST" or query ~= "" then return nil end
        local where = "/v1/projects/" .. PROJECT .. "/locations/" .. REGION
            .. "/publishers/anthropic/models/"
        if path:sub(1, #where) ~= where then return nil end
        local rest = path:sub(#where + 1)
        if rest == "count-tokens:rawPredict" then return "free", BASE_PATH .. path end
        local model, op = rest:match("^([^/:]+):([A-Za-z]+)$")
        if not model or #model > 256 or not model:match(VERTEX_MODEL)
            or (op ~= "rawPredict" and op ~= "streamRawPredict") then
            return nil
        end
        return "message", BASE_PATH .. path
    end
    local class = MESSAGE_PATHS[path]
    if method ~= "POST" or not class or (query ~= "" and query ~= "beta=true") then
        return nil
    end
    return class, BASE_PATH .. path .. (query ~= "" and ("?" .. query) or "")
end

--- What the port answers itself for a ``local`` request: (status, JSON body).
function M.local_answer()
    return 200, '{"inferenceProfileSummaries":[]}'
end

-- ---------------------------------------------------------------------------------
-- 2. the body and the betas

-- The fields of each API's request body beyond the Messages API's own (which the caller
-- knows), and the Messages API fields it does not take.
local EXTRA_FIELDS = {
    anthropic = {},
    bedrock = { anthropic_version = true, anthropic_beta = true },
    vertex = { anthropic_version = true },
}
local NOT_TAKEN = {
    anthropic = {},
    bedrock = { model = true, stream = true },
    vertex = { model = true },
}

--- Whether ``field`` may be in a body of ``class`` (``known``: a Messages API field).
function M.field_allowed(field, known, class)
    if EXTRA_FIELDS[API][field] then return true end
    if NOT_TAKEN[API][field] and not (API == "vertex" and class == "free") then
        return false
    end
    return known
end

--- The betas a body asks for (Bedrock's anthropic_beta), or nil and a problem.
function M.body_betas(body)
    if API ~= "bedrock" or body.anthropic_beta == nil then return {} end
    local betas = body.anthropic_beta
    if type(betas) ~= "table" then return nil, "anthropic_beta is not a list" end
    for key, name in pairs(betas) do
        if type(key) ~= "number" or type(name) ~= "string" then
            return nil, "anthropic_beta is not a list of names"
        end
    end
    return betas
end

--- Whether a beta the policy does not allow is dropped from the call rather than refused.
function M.drops_beta(name)
    local family = name:match("^(.-)%-%d%d%d%d%-?%d%d%-?%d%d$") or name
    return DROP[family] == true
end

-- ---------------------------------------------------------------------------------
-- 3. the credential on its way upstream

local function amz_date()
    local t = ngx.utctime()  -- "yyyy-mm-dd hh:mm:ss"
    return t:gsub("[-:]", ""):gsub(" ", "T") .. "Z"
end

-- The path as sent upstream, encoded once more: every AWS service but S3 signs it so.
local function canonical_uri(path)
    return (path:gsub("[^A-Za-z0-9/._~-]", function(c)
        return string.format("%%%02X", string.byte(c))
    end))
end

--- The SigV4 headers of a POST of ``body`` to ``target`` (no query) with ``key``.
function M.sigv4(key, target, body, when)
    when = when or amz_date()
    local date = when:sub(1, 8)
    local payload = sha256_hex(body)
    local signed = "host;x-amz-content-sha256;x-amz-date;x-amz-security-token"
    local canonical = table.concat({
        "POST", canonical_uri(target), "",
        "host:" .. HOST, "x-amz-content-sha256:" .. payload, "x-amz-date:" .. when,
        "x-amz-security-token:" .. key.token, "",
        signed, payload,
    }, "\n")
    local scope = date .. "/" .. REGION .. "/bedrock/aws4_request"
    local to_sign = table.concat(
        { "AWS4-HMAC-SHA256", when, scope, sha256_hex(canonical) }, "\n")
    local k = hmac("AWS4" .. key.secret, date)
    k = hmac(k, REGION)
    k = hmac(k, "bedrock")
    k = hmac(k, "aws4_request")
    local signature = hex(hmac(k, to_sign))
    return {
        ["authorization"] = "AWS4-HMAC-SHA256 Credential=" .. key.id .. "/" .. scope
            .. ", SignedHeaders=" .. signed .. ", Signature=" .. signature,
        ["x-amz-date"] = when,
        ["x-amz-content-sha256"] = payload,
        ["x-amz-security-token"] = key.token,
    }
end

--- Set the operator's credential on the request about to go upstream (the agent's own
--- credentials are already gone); ``betas`` is the anthropic-beta list it carries.
function M.authorize(key, target, body, betas)
    if AUTH == "sigv4" then
        for name, value in pairs(M.sigv4(key, target, body or "")) do
            ngx.req.set_header(name, value)
        end
    elseif AUTH == "x-api-key" then
        ngx.req.set_header("x-api-key", key.value)
    else
        ngx.req.set_header("authorization", "Bearer " .. key.value)
        if AUTH == "oauth" then
            local found = false
            for _, name in ipairs(betas) do found = found or name == OAUTH_BETA end
            if not found then
                betas[#betas + 1] = OAUTH_BETA
                ngx.req.set_header("anthropic-beta", table.concat(betas, ","))
            end
        end
    end
end

return M
