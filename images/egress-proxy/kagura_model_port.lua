-- The key-injecting port's checks, run by nginx (lua-nginx-module) in the egress proxy.
--
-- Every request on the port passes here before nginx forwards it to the model API with
-- the operator's key; nothing else reaches the upstream. In order (access):
--
--   1. the request line: origin-form only (no absolute URI, no CONNECT), and the path as
--      sent must be one the policy offers, byte for byte after decoding and normalising
--      (an encoded '?', '%2e%2e', '//' or '/./' never matches);
--   2. headers: no upgrade, no content coding, every `anthropic-beta` value (all the
--      headers, every comma-separated name) allowed by the policy; credentials the agent
--      sent (x-api-key, authorization, cookies) are dropped, the operator's key is set;
--   3. the body: strict JSON (no duplicate key at any depth, no NaN, bounded depth),
--      only fields of the Messages API the policy knows, no server-side tool, MCP
--      connector, URL source or file reference the policy does not allow;
--   4. the call is counted when it starts: turn calls (with tools), side calls (without)
--      and free calls (token counting) each against their own cap, and all of them
--      against a concurrency cap; past a cap nothing is forwarded.
--
-- Responses (header_filter, body_filter) never carry the key back: a header holding it
-- is dropped, in the body it is replaced, also when it is split across chunks; a stream
-- is passed on chunk by chunk (only a chunk's tail that could begin the key waits for
-- the next chunk).
--
-- One line per request goes to stdout in the egress log's KAGURA1 format (the host's
-- collector reads squid's and these lines alike): allowed with its class, or denied
-- with the reason.

local cjson = require "cjson.safe"
local upstream = require "kagura_upstream"

local M = {}

local KEY_PATH = nil     -- the operator's credential, read on every request (upstream.read_key)
local POLICY = nil
local LIMITS_PATH = "/run/kagura-inject/limits.json"
local UPSTREAM = "-"
local UPSTREAM_PORT = "443"
local MAX_DEPTH = 64
local MAX_PATH_LOGGED = 1024
local MAX_HEADERS = 1000

cjson.decode_invalid_numbers(false)
cjson.decode_max_depth(MAX_DEPTH)

-- Fields of a Messages API request that ask the provider for nothing beyond the answer.
local MESSAGE_FIELDS = {
    model = true, messages = true, system = true, max_tokens = true, metadata = true,
    stop_sequences = true, stream = true, temperature = true, top_p = true, top_k = true,
    tools = true, tool_choice = true, thinking = true, service_tier = true,
    context_management = true, output_format = true, output_config = true,
    mcp_servers = true, container = true,
}
-- Tools the client runs itself (the provider only describes them to the model).
local CLIENT_TOOL_FAMILIES = {
    custom = true, bash = true, text_editor = true, computer = true, memory = true,
}
-- Request headers passed on to the upstream; every other one is dropped.
-- (The credential headers are the endpoint's: kagura_upstream.authorize sets them.)
local PASSED_HEADERS = {
    ["accept"] = true, ["accept-language"] = true, ["anthropic-version"] = true,
    ["anthropic-beta"] = true, ["content-type"] = true, ["user-agent"] = true,
    ["x-app"] = true, ["anthropic-dangerous-direct-browser-access"] = true,
    ["content-length"] = true, ["transfer-encoding"] = true, ["host"] = true,
    ["connection"] = true,
}
local PASSED_PREFIXES = { "x-stainless-", "x-claude-code-" }

local function read_file(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local data = f:read("*a")
    f:close()
    return data
end

local function set_of(list)
    local out = {}
    for _, v in ipairs(list or {}) do out[v] = true end
    return out
end

--- init: read the policy and the key (init_by_lua, before the workers fork).
function M.init(policy_path, key_path)
    local policy = cjson.decode(read_file(policy_path) or "")
    if type(policy) ~= "table" then error("kagura: the model-call policy is unreadable") end
    upstream.init(policy)
    if not upstream.read_key(key_path) then error("kagura: the injected credential is missing") end
    KEY_PATH = key_path
    UPSTREAM = policy.upstream_host or "-"
    UPSTREAM_PORT = tostring(policy.upstream_port or 443)
    POLICY = {
        server_tools = set_of(policy.server_tools),
        mcp_hosts = set_of(policy.mcp_servers),
        url_sources = policy.url_sources == true,
        files = policy.files == true,
        betas = set_of(policy.betas),
        beta_families = set_of(policy.beta_families),
    }
    -- Say which policy is now loaded (the host waits for it after a mid-run grant).
    local loaded_path = (policy_path:gsub("policy%.json$", "policy.loaded"))
    local loaded = io.open(loaded_path, "wb")
    if loaded then
        loaded:write(tostring(math.floor(tonumber(policy.generation) or 0)))
        loaded:close()
    end
    io.stdout:setvbuf("full")
end

-- ---------------------------------------------------------------------------------
-- the log line

local function esc(text)
    -- squid's %# encoding: anything but unreserved characters and '/' is %XX, so a
    -- field never holds a space and a line is always whole.
    text = tostring(text or "")
    if text == "" then return "-" end
    return (text:gsub("[^A-Za-z0-9._~/:=-]", function(c)
        return string.format("%%%02X", string.byte(c))
    end))
end

local function write_log(fields)
    local line = table.concat(fields, " ")
    io.stdout:write(line, "\n")
    io.stdout:flush()
end

-- ---------------------------------------------------------------------------------
-- refusals

local function refuse(status, reason, message, kind)
    local ctx = ngx.ctx
    ctx.reason = reason
    ctx.kind = "MODEL_DENIED"
    ngx.status = status
    ngx.header["content-type"] = "application/json"
    ngx.header["x-should-retry"] = status == 429 and "true" or "false"
    if status == 429 then ngx.header["retry-after"] = "1" end
    ngx.print(cjson.encode({
        type = "error",
        error = {
            type = kind or "permission_error",
            message = "kagura model-call policy: " .. message,
        },
    }))
    return ngx.exit(ngx.HTTP_OK)
end

-- ---------------------------------------------------------------------------------
-- 1. the request line and the path

local function percent_decode(s)
    return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- Dot segments resolved and empty segments dropped: what a lenient server might make of
-- the path. Only used to say what was asked; the match is on the path as sent.
local function normalise(path)
    local out = {}
    for seg in path:gmatch("[^/]+") do
        if seg == ".." then
            out[#out] = nil
        elseif seg ~= "." then
            out[#out + 1] = seg
        end
    end
    return "/" .. table.concat(out, "/")
end

local function file_path_class(path, method)
    if path == "/v1/files" then
        return (method == "GET" or method == "POST") and "files" or nil
    end
    local id, rest = path:match("^/v1/files/(file_[A-Za-z0-9]+)(.*)$")
    if not id then return nil end
    if rest == "" and (method == "GET" or method == "DELETE") then return "files" end
    if rest == "/content" and method == "GET" then return "files" end
    return nil
end

local function request_target()
    -- The raw request line: nginx's $uri is already decoded and merged, which is what
    -- must not decide here.
    local line = ngx.var.request or ""
    local method, target = line:match("^(%S+) (%S+)")
    return method or "", target or ""
end

-- ---------------------------------------------------------------------------------
-- 2. headers

local function header_values(value)
    if value == nil then return {} end
    if type(value) == "table" then return value end
    return { value }
end

local function beta_allowed(name)
    if POLICY.betas[name] then return true end
    local family = name:match("^(.-)%-%d%d%d%d%-?%d%d%-?%d%d$")
    return family ~= nil and POLICY.beta_families[family] == true
end

-- The betas a call asks for, every one allowed by the policy (or dropped, for an API
-- where the CLI sends a feature beta the policy does not allow on every call).
local function check_betas(names, kept)
    for _, name in ipairs(names) do
        if not beta_allowed(name) then
            if not upstream.drops_beta(name) then
                return "beta", "the beta " .. name .. " is not in the model-call policy"
            end
        elseif kept then
            kept[#kept + 1] = name
        end
    end
    return nil
end

local function check_headers(headers, kept)
    for _, v in ipairs(header_values(headers["upgrade"])) do
        if v ~= "" then return "upgrade", "a protocol upgrade is not offered" end
    end
    for _, v in ipairs(header_values(headers["content-encoding"])) do
        if v:lower() ~= "identity" then
            return "body", "a content-coded request body cannot be checked"
        end
    end
    local names = {}
    for _, value in ipairs(header_values(headers["anthropic-beta"])) do
        for name in (value .. ","):gmatch("([^,]*),") do
            name = name:match("^%s*(.-)%s*$")
            if name ~= "" then names[#names + 1] = name end
        end
    end
    return check_betas(names, kept)
end

local function passed_header(name)
    if PASSED_HEADERS[name] then return true end
    for _, prefix in ipairs(PASSED_PREFIXES) do
        if name:sub(1, #prefix) == prefix then return true end
    end
    return false
end

-- ---------------------------------------------------------------------------------
-- 3. the body

-- cjson keeps the last of two equal keys; another parser may keep the first. A body
-- where that could matter is refused: every object's keys are compared as decoded.
-- The body is valid JSON here (cjson read it), so the scan only tracks structure.
local function duplicate_key(s)
    local find, byte, sub = string.find, string.byte, string.sub
    local stack, depth, pos = {}, 0, 1
    while true do
        local i = find(s, '[{}%[%]"]', pos)
        if not i then return nil end
        local c = byte(s, i)
        if c == 34 then
            local j = i + 1
            while true do
                local k = find(s, '["\\]', j)
                if not k then return nil end
                if byte(s, k) == 92 then
                    j = k + 2
                else
                    j = k
                    break
                end
            end
            local keys = stack[depth]
            if keys then
                local after = find(s, "[^ \t\r\n]", j + 1)
                if after and byte(s, after) == 58 then
                    local key = sub(s, i + 1, j - 1)
                    if find(key, "\\", 1, true) then
                        key = cjson.decode('"' .. key .. '"') or key
                    end
                    if keys[key] then return key end
                    keys[key] = true
                end
            end
            pos = j + 1
        elseif c == 123 then
            depth = depth + 1
            stack[depth] = {}
            pos = i + 1
        elseif c == 91 then
            depth = depth + 1
            stack[depth] = false
            pos = i + 1
        else
            stack[depth] = nil
            depth = depth - 1
            pos = i + 1
        end
    end
end

local function tool_family(kind)
    if kind == nil then return "custom" end
    if type(kind) ~= "string" then return nil end
    return kind:match("^(.-)_%d+$") or kind
end

local function host_of(url)
    if type(url) ~= "string" then return nil end
    local host = url:match("^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]+)")
    if not host then return nil end
    host = host:gsub("^.*@", ""):gsub(":%d+$", "")
    return host:lower()
end

-- Every place in the request where the provider would reach out, wherever it is nested
-- (messages, system, tool results, tool definitions): a source by URL, a file reference,
-- a container upload.
local function walk(node, depth)
    if depth > MAX_DEPTH then return "body", "the body is nested too deeply" end
    if type(node) ~= "table" then return nil end
    local kind = node.type
    if kind == "url" and node.url ~= nil and not POLICY.url_sources then
        return "url-source", "a source the provider would fetch by URL is not allowed"
    end
    if (node.file_id ~= nil or kind == "file" or kind == "container_upload")
        and not POLICY.files then
        return "file-reference", "a file reference (Files API) is not allowed"
    end
    for name, child in pairs(node) do
        -- mcp_servers name their servers by URL: checked on their own (check_body).
        if type(child) == "table" and not (depth == 0 and name == "mcp_servers") then
            local reason, message = walk(child, depth + 1)
            if reason then return reason, message end
        end
    end
    return nil
end

local function check_body(body, class)
    for field in pairs(body) do
        if type(field) ~= "string"
            or not upstream.field_allowed(field, MESSAGE_FIELDS[field] == true, class) then
            return "body", "the field " .. tostring(field) .. " is not one the policy knows"
        end
    end
    local betas, problem = upstream.body_betas(body)
    if betas == nil then return "body", problem end
    local reason, message = check_betas(betas, nil)
    if reason then return reason, message end
    local tools = body.tools
    if tools ~= nil and type(tools) ~= "table" then return "body", "tools is not a list" end
    for _, tool in ipairs(tools or {}) do
        if type(tool) ~= "table" then return "body", "a tool is not an object" end
        local family = tool_family(tool.type)
        if family == nil then return "server-tool", "a tool of no known type" end
        if family == "mcp_toolset" then
            if next(POLICY.mcp_hosts) == nil then
                return "mcp", "MCP connectors are not allowed"
            end
        elseif not CLIENT_TOOL_FAMILIES[family] and not POLICY.server_tools[family] then
            return "server-tool", "the server-side tool " .. family .. " is not allowed"
        end
    end
    local servers = body.mcp_servers
    if servers ~= nil then
        if type(servers) ~= "table" then return "body", "mcp_servers is not a list" end
        for _, server in ipairs(servers) do
            local host = type(server) == "table" and host_of(server.url) or nil
            if not host or not POLICY.mcp_hosts[host] then
                return "mcp", "an MCP connector to " .. tostring(host) .. " is not allowed"
            end
        end
        for key in pairs(servers) do
            if type(key) ~= "number" then return "body", "mcp_servers is not a list" end
        end
    end
    if body.container ~= nil and not POLICY.server_tools.code_execution then
        return "server-tool", "a code execution container is not allowed"
    end
    return walk(body, 0)
end

local function read_body()
    ngx.req.read_body()
    local data = ngx.req.get_body_data()
    if data == nil then
        local path = ngx.req.get_body_file()
        if path then data = read_file(path) end
    end
    return data
end

-- ---------------------------------------------------------------------------------
-- 4. counting

local function limits()
    local parsed = cjson.decode(read_file(LIMITS_PATH) or "")
    if type(parsed) ~= "table" then return nil end
    return parsed
end

-- Take one place of ``class`` (turn, side, free, files) and one of the concurrency cap,
-- atomically; nil and a refusal when a cap is reached. Counted at the start: a call
-- that fails upstream was still a call.
local function take(class)
    local dict = ngx.shared.kagura_calls
    local caps = limits()
    if caps == nil then return "limits", "the model-call limits are unreadable" end
    local concurrency = tonumber(caps.concurrency) or 1
    local now = dict:incr("inflight", 1, 0)
    if now > concurrency then
        dict:incr("inflight", -1)
        return "concurrency", "more than " .. concurrency .. " model calls at once"
    end
    ngx.ctx.inflight = true
    local cap = caps[class]
    local n = dict:incr(class, 1, 0)
    if cap ~= nil and cap ~= cjson.null and n > tonumber(cap) then
        dict:incr(class, -1)
        dict:incr("inflight", -1)
        ngx.ctx.inflight = false
        return "budget", "the run's budget of " .. tostring(cap) .. " " .. class
            .. " calls is spent"
    end
    return nil
end

-- ---------------------------------------------------------------------------------
-- the phases

function M.access()
    local ctx = ngx.ctx
    local key = upstream.read_key(KEY_PATH)
    ctx.secrets = key and key.secrets or {}
    local method, target = request_target()
    ctx.method = method
    local raw_path = target:match("^[^?]*") or ""
    local query = target:sub(#raw_path + 2)
    ctx.path = raw_path
    if target:sub(1, 1) ~= "/" then
        return refuse(403, "not-model-call", "only origin-form requests to the model API")
    end
    local decoded = percent_decode(raw_path)
    local canonical = normalise(decoded)
    ctx.path = canonical
    local class, forward = nil, nil
    if decoded == raw_path and canonical == raw_path then
        class, forward = upstream.classify(method, raw_path, query)
        if class == nil and POLICY.files and upstream.api() == "anthropic" then
            class = file_path_class(raw_path, method)
            forward = raw_path .. (query ~= "" and ("?" .. query) or "")
            if class and query ~= "" and query ~= "beta=true" then class = nil end
        end
    end
    if class == nil then
        return refuse(403, "not-model-call",
            method .. " " .. canonical .. " (with its query) is not a model call the policy offers")
    end
    if class == "local" then
        -- Answered here (the CLI's inference-profile discovery on Bedrock): nothing goes
        -- upstream, no credential is used, nothing is counted.
        ctx.kind = "MODEL_LOCAL"
        local status, answer = upstream.local_answer()
        ngx.status = status
        ngx.header["content-type"] = "application/json"
        ngx.print(answer)
        return ngx.exit(ngx.HTTP_OK)
    end
    if key == nil then
        return refuse(503, "credential", "the run holds no credential for the model any more",
            "api_error")
    end
    local headers, truncated = ngx.req.get_headers(MAX_HEADERS)
    if truncated then return refuse(400, "not-model-call", "too many request headers") end
    local betas = {}
    local reason, message = check_headers(headers, betas)
    if reason then return refuse(403, reason, message) end
    local data = nil
    if class ~= "files" then
        ctx.reason = "body"  -- until the body is read whole (a 413 keeps it)
        data = read_body()
        ctx.reason = nil
        if data == nil or data == "" then return refuse(400, "body", "no request body") end
        local body = cjson.decode(data)
        if type(body) ~= "table" or data:match("^%s*%[") then
            return refuse(400, "body", "the body is not one JSON object")
        end
        local dup = duplicate_key(data)
        if dup then return refuse(400, "body", "the key " .. dup .. " appears twice") end
        reason, message = check_body(body, class)
        if reason then return refuse(403, reason, message) end
        if class == "message" then
            local tools = body.tools
            class = (type(tools) == "table" and #tools > 0) and "turn" or "side"
        end
    end
    reason, message = take(class)
    if reason then
        local status = reason == "concurrency" and 429 or 403
        local kind = reason == "concurrency" and "rate_limit_error" or "permission_error"
        return refuse(status, reason, message, kind)
    end
    ctx.kind = "MODEL_" .. class:upper()
    -- What the agent sent as credentials goes nowhere; the operator's goes upstream.
    for name in pairs(headers) do
        if not passed_header(name) then ngx.req.clear_header(name) end
    end
    if headers["anthropic-beta"] ~= nil then
        -- As checked: one header, the betas kept (a dropped one goes nowhere).
        if #betas > 0 then
            ngx.req.set_header("anthropic-beta", table.concat(betas, ","))
        else
            ngx.req.clear_header("anthropic-beta")
        end
    end
    upstream.authorize(key, forward, data, betas)
    ngx.var.kagura_target = forward
end

local function secrets()
    return ngx.ctx.secrets or {}
end

function M.header_filter()
    local headers = ngx.resp.get_headers(MAX_HEADERS)
    for name, value in pairs(headers) do
        local drop = name == "x-api-key" or name == "authorization"
            or name == "x-amz-security-token"
        for _, v in ipairs(header_values(value)) do
            for _, secret in ipairs(secrets()) do
                if v:find(secret, 1, true) then drop = true end
            end
        end
        if drop then ngx.header[name] = nil end
    end
    ngx.header["content-length"] = nil  -- the body may be rewritten below
end

-- The key replaced in the body; the tail of a chunk that could begin it waits for the
-- next chunk (an SSE event ends in a newline, which no key holds: nothing waits).
local function scrub(data, secret)
    if not data:find(secret, 1, true) then return data end
    local parts, pos = {}, 1
    while true do
        local i, j = data:find(secret, pos, true)
        if not i then break end
        parts[#parts + 1] = data:sub(pos, i - 1)
        parts[#parts + 1] = "(redacted by kagura)"
        pos = j + 1
    end
    parts[#parts + 1] = data:sub(pos)
    ngx.ctx.scrubbed = true
    return table.concat(parts)
end

-- How much of the end of ``data`` could begin ``secret`` (held for the next chunk).
local function tail_of(data, secret)
    for k = math.min(#secret - 1, #data), 1, -1 do
        if data:sub(-k) == secret:sub(1, k) then return k end
    end
    return 0
end

function M.body_filter()
    local ctx = ngx.ctx
    local chunk, eof = ngx.arg[1], ngx.arg[2]
    local data = (ctx.held or "") .. (chunk or "")
    ctx.held = nil
    for _, secret in ipairs(secrets()) do data = scrub(data, secret) end
    if not eof then
        local hold = 0
        for _, secret in ipairs(secrets()) do hold = math.max(hold, tail_of(data, secret)) end
        if hold > 0 then
            ctx.held = data:sub(-hold)
            data = data:sub(1, -hold - 1)
        end
    end
    ngx.arg[1] = data
end

function M.log()
    local ctx = ngx.ctx
    if ctx.inflight then
        ngx.shared.kagura_calls:incr("inflight", -1)
        ctx.inflight = false
    end
    local server = ngx.var.upstream_addr
    if ctx.kind == "MODEL_DENIED" or server == nil or server == "" then
        server = "-"
    else
        -- The last address tried, without its port (as squid logs the server).
        server = server:match("([^%s,]+)$") or "-"
        server = server:gsub(":%d+$", "")
    end
    local path = ctx.path or ""
    if #path > MAX_PATH_LOGGED then path = path:sub(1, MAX_PATH_LOGGED) end
    write_log({
        "KAGURA1",
        ngx.var.msec,
        "127.0.0.1",
        esc(ctx.method or ""),
        "http",
        esc(UPSTREAM),
        UPSTREAM_PORT,
        tostring(ngx.status or 0),
        ctx.kind or "MODEL_DENIED",
        tostring(ngx.var.request_length or 0),
        tostring(ngx.var.bytes_sent or 0),
        esc(server),
        esc(ctx.reason or (ctx.kind and "" or "not-model-call")),
        "3129",
        esc(path),
    })
end

return M
