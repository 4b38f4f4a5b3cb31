"""ct_env_check.py ENV: is the Python environment at ENV still what was built? (Run in the container by
ct_unit_facts.sh with the container's python3; standard library only.)

The builder (ct_env_build.py) wrote ENV/.gpuhost-env-files.json: every file pip's RECORDs list, with its size, its
sha256 after the patches and its stat as built. A file whose stat is unchanged was not written since (its ctime
would have moved: user space cannot set it back), so a check of an untouched environment reads no file; a file whose
stat moved is hashed, and one that still has its sha256 is remembered by its new stat
(/var/lib/gpuhost/env-check/<id>.json). Code in site-packages (.py, .so, .pth) or a file in bin that the list lacks was
added by hand (bytecode, and a package's own caches or locks written beside its code at run time, are not code). Prints one JSON line: {"ok": true|false|null (null: an environment built before the program kept
the list), "changed": [...], "missing": [...], "added": [...], "counts": [changed, missing, added]}."""

import hashlib
import json
import os
import stat
import sys

FILES = '.gpuhost-env-files.json'
CACHE_DIR = '/var/lib/gpuhost/env-check'
SHOWN = 5
CODE = ('.py', '.pth', '.so')


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def key(st):
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def roots(env):
    lib = os.path.join(env, 'lib')
    out = [os.path.join(env, 'bin')]
    if os.path.isdir(lib):
        out += [os.path.join(lib, d, 'site-packages') for d in sorted(os.listdir(lib)) if d.startswith('python')]
    return [r for r in out if os.path.isdir(r)]


def check(env):
    try:
        with open(os.path.join(env, FILES)) as f:
            files = json.load(f)['files']
    except FileNotFoundError:
        return {'ok': None}
    ident = os.path.basename(env.rstrip('/'))
    cache_path = os.path.join(CACHE_DIR, ident + '.json')
    try:
        with open(cache_path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    changed, missing, new_cache = [], [], {}
    for rel, (size, sha, *built) in sorted(files.items()):
        p = os.path.join(env, rel)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            missing.append(rel)
            continue
        k = key(st)
        if built and k == [size] + list(built):
            continue
        if cache.get(rel) == k:
            new_cache[rel] = k
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size != size or sha256_file(p) != sha:
            changed.append(rel)
            continue
        new_cache[rel] = k
    added = []
    for root in roots(env):
        for dirpath, dirnames, names in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != '__pycache__']
            for name in names:
                p = os.path.join(dirpath, name)
                rel = os.path.relpath(p, env)
                if rel in files or name.endswith('.pyc') or os.path.islink(p):
                    continue
                # What Python would run: code, extension modules, .pth files (run at every start), scripts. A
                # package's own cache or lock file written beside its code at run time is not a change of the code.
                if root != os.path.join(env, 'bin') and not name.endswith(CODE):
                    continue
                added.append(rel)
    if new_cache != cache:
        try:
            os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
            tmp = cache_path + '.tmp'
            with open(tmp, 'w') as f:
                json.dump(new_cache, f)
            os.replace(tmp, cache_path)
        except OSError:
            pass
    return {'ok': not (changed or missing or added), 'changed': changed[:SHOWN], 'missing': missing[:SHOWN],
            'added': sorted(added)[:SHOWN], 'counts': [len(changed), len(missing), len(added)]}


if __name__ == '__main__':
    print(json.dumps(check(sys.argv[1]), sort_keys=True))
