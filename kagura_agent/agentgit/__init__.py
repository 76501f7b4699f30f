"""The agent's commits come back as a branch for review (``spec.commits: branch``).

The operator's ``.git`` stays the operator's: its hooks and config run on the operator's
next git command, so the agent never writes it. Instead, in branch mode:

1. **Seed** (:mod:`.seed`, host facts in :mod:`.base`): the agent's container gets a
   repository of its own at ``/workspace/.git`` — a tmpfs, so nothing of it reaches the
   host's disk — seeded, before the agent runs, from the operator's HEAD: a fresh
   ``git init`` with no template (no hooks), no copy of the operator's config, the
   operator's objects borrowed read-only (``objects/info/alternates`` to the operator's
   ``.git`` mounted read-only at :data:`.seed.OPERATOR_GIT`), one branch
   ``kagura/<task>/<run>`` at the seed and the index read from it. The agent commits,
   branches, rewrites, writes hooks and config there as it likes: it all stays in its
   container.
2. **Export** (:mod:`.export`): when its turn is over, while its container still runs,
   the host lists the repository's refs and asks for a git bundle of that one branch on
   top of the seed, each through ``docker exec`` of the image's git in the container —
   whatever the agent left there (hooks, config, alternates, symlinks) acts inside its
   own sandbox only. The host reads at most :data:`.export.MAX_BUNDLE_BYTES`.
3. **Import** (:mod:`.importer`): the host treats the bundle as hostile bytes. In a
   scratch repository of its own (no hooks, no fsmonitor, objects checked with fsck) it
   takes the branch and refuses anything but plain commits on top of the seed: a
   history that does not descend from the seed (a rewrite), a commit whose parents are
   not the seed or the agent's own commits, a submodule, an object over
   :data:`.importer.MAX_OBJECT_BYTES`. Other refs (tags, branches, notes, replace refs,
   a stash) are never imported, and said. Only then does it fetch the branch into the
   operator's repository — hooks and fsmonitor off, one new ref, no tags, no other ref
   touched — as ``kagura/<task>/<run>``.

Pushing is not part of it: the branch is the operator's to review, and a push is the
operator's (or a separately approved credential's) to make.
"""
