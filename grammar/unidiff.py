"""Unified diffs (`diff -u`, `git diff`): read, checked, and applied strictly - every hunk's context and
removed lines must match the file exactly (at the stated line or, as GNU patch and git apply do, at
another line where they match exactly; never with fuzz), and a patch applies whole or not at all.

Used twice: at preview, to check a declared patch (a text diff of relative paths that stay inside the
tree it is applied to, no binary parts, no renames); and inside the container, where the environment
builder (hostscripts/ct_env_build.py, sent along with this module's source) applies the patches
to the installed packages - a debian-12-standard container has neither `patch` nor `git`.

Stdlib only and no `from __future__` import: this source is sent ahead of the builder's in one program.
"""

import re

HUNK_RE = re.compile(r'^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@')
DEV_NULL = '/dev/null'


class PatchError(ValueError):
    pass


class Hunk(object):
    def __init__(self, old_start, old_len, new_start, new_len, lines, header_line):
        self.old_start, self.old_len, self.new_start, self.new_len = old_start, old_len, new_start, new_len
        self.lines = lines          # [(' '|'-'|'+', text with its newline or without, at end of file)]
        self.header_line = header_line

    def old(self):
        return [t for tag, t in self.lines if tag in ' -']

    def new(self):
        return [t for tag, t in self.lines if tag in ' +']


class FilePatch(object):
    def __init__(self, old_path, new_path, hunks):
        self.old_path, self.new_path, self.hunks = old_path, new_path, hunks

    @property
    def path(self):
        return self.new_path if self.new_path != DEV_NULL else self.old_path

    @property
    def creates(self):
        return self.old_path == DEV_NULL

    @property
    def deletes(self):
        return self.new_path == DEV_NULL


def _path(raw, line_no):
    """A header's path: timestamps after a tab dropped, git's a/ b/ prefixes handled by the caller."""
    p = raw.split('\t', 1)[0].strip()
    if p.startswith('"'):
        raise PatchError('line %d: quoted path %s; patch files whose names need quoting are not supported'
                         % (line_no, p[:80]))
    return p


def check_relative(path, line_no):
    if path == DEV_NULL:
        return path
    if (not path or path.startswith('/') or '\\' in path or any(p in ('', '.', '..') for p in path.split('/'))
            or any(ord(c) < 0x20 or ord(c) == 0x7f for c in path)):
        raise PatchError('line %d: %r is not a relative path inside the tree the patch applies to (no leading '
                         '"/", no "..", no empty parts)' % (line_no, path[:120]))
    return path


def parse(text):
    """[FilePatch] of a unified diff; PatchError names the line for anything else."""
    if '\0' in text:
        raise PatchError('holds a NUL byte: a binary file, not a text diff')
    lines = text.splitlines(True)
    for n, line in enumerate(lines, 1):
        if line.startswith('GIT binary patch') or line.startswith('Binary files '):
            raise PatchError('line %d: a binary patch; only text diffs apply' % n)
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(('rename from ', 'rename to ', 'copy from ', 'copy to ')):
            raise PatchError('line %d: %s - renames and copies are not applied; make the patch with '
                             'git diff --no-renames' % (i + 1, line.strip()[:80]))
        if not line.startswith('--- '):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith('+++ '):
            raise PatchError('line %d: "---" header without a "+++" line after it' % (i + 1))
        old, new = _path(line[4:], i + 1), _path(lines[i + 1][4:], i + 2)
        if old.startswith('a/') and new.startswith('b/') or (old == DEV_NULL and new.startswith('b/')) or \
                (new == DEV_NULL and old.startswith('a/')):
            old = old if old == DEV_NULL else old[2:]
            new = new if new == DEV_NULL else new[2:]
        if old == DEV_NULL and new == DEV_NULL:
            raise PatchError('line %d: both sides are /dev/null' % (i + 1))
        check_relative(old, i + 1)
        check_relative(new, i + 2)
        if DEV_NULL not in (old, new) and old != new:
            raise PatchError('line %d: %s -> %s renames a file; renames are not applied (git diff --no-renames)'
                             % (i + 1, old, new))
        i += 2
        hunks = []
        while i < len(lines) and lines[i].startswith('@@'):
            m = HUNK_RE.match(lines[i])
            if not m:
                raise PatchError('line %d: %r is not a hunk header (@@ -l,s +l,s @@)' % (i + 1, lines[i].strip()[:80]))
            os_, ol, ns, nl = (int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1),
                               int(m.group(3)), int(m.group(4) if m.group(4) is not None else 1))
            header = i + 1
            i += 1
            body, seen_old, seen_new = [], 0, 0
            while (seen_old < ol or seen_new < nl) and i < len(lines):
                line = lines[i]
                tag = line[:1]
                if line in ('\n', '\r\n'):
                    tag, line = ' ', ' ' + line   # an empty context line some editors strip to nothing
                if tag not in ' -+':
                    raise PatchError('line %d: hunk at line %d ends early (expected %d old / %d new lines)' % (
                        i + 1, header, ol, nl))
                body.append([tag, line[1:]])
                seen_old += tag in ' -'
                seen_new += tag in ' +'
                i += 1
                if i < len(lines) and lines[i].startswith('\\'):
                    # "\ No newline at end of file": the line before has none.
                    body[-1][1] = body[-1][1].rstrip('\r\n')
                    i += 1
            if seen_old != ol or seen_new != nl:
                raise PatchError('line %d: hunk has %d old / %d new lines, its header says %d / %d' % (
                    header, seen_old, seen_new, ol, nl))
            hunks.append(Hunk(os_, ol, ns, nl, [tuple(b) for b in body], header))
        if not hunks:
            raise PatchError('line %d: %s has no hunk' % (i, new if new != DEV_NULL else old))
        fp = FilePatch(old, new, hunks)
        if fp.creates and any(h.old() for h in hunks):
            raise PatchError('line %d: creates %s but its hunk has old lines' % (hunks[0].header_line, new))
        if fp.deletes and any(h.new() for h in hunks):
            raise PatchError('line %d: deletes %s but its hunk has new lines' % (hunks[0].header_line, old))
        out.append(fp)
    if not out:
        raise PatchError('no "--- / +++" file header: not a unified diff (make it with diff -u or git diff)')
    paths = [fp.path for fp in out]
    dup = sorted({p for p in paths if paths.count(p) > 1})
    if dup:
        raise PatchError('patches %s twice; one section per file' % dup[0])
    return out


def _find(content, old, start):
    """Where `old` (lines) sits in content: at `start`, else the nearest exact match; None if nowhere."""
    n = len(old)
    if content[start:start + n] == old:
        return start
    for delta in range(1, len(content) + 1):
        for at in (start - delta, start + delta):
            if 0 <= at <= len(content) - n and content[at:at + n] == old:
                return at
        if start - delta < 0 and start + delta > len(content) - n:
            break
    return None


def apply_file(fp, text):
    """The new text of one file (None: deleted). text: its current content (None: absent)."""
    if fp.creates:
        if text is not None:
            raise PatchError('%s: would be created, but it exists already' % fp.path)
        content = []
    else:
        if text is None:
            raise PatchError('%s: no such file' % fp.old_path)
        content = text.splitlines(True)
    shift = 0   # how far the file's lines have moved from the numbers in the hunk headers
    for n, h in enumerate(fp.hunks, 1):
        old, new = h.old(), h.new()
        start = (h.old_start - 1 if h.old_len else h.old_start) + shift
        at = _find(content, old, max(0, start))
        if at is None:
            raise PatchError('%s: hunk %d (@@ -%d,%d) does not apply: the file\'s lines there are not the ones the '
                             'patch expects (a patch made for another version?)' % (fp.path, n, h.old_start, h.old_len))
        content[at:at + len(old)] = new
        shift += (at - start) + len(new) - len(old)
    if fp.deletes:
        if content:
            raise PatchError('%s: would be deleted, but lines the patch does not name remain' % fp.path)
        return None
    return ''.join(content)


def apply_all(patches, read):
    """patches: [(name, [FilePatch])] in order; read(path) -> current text or None. Returns {path: new text
    or None (deleted)} for every file touched, computed whole before anything is written (a later patch
    sees the earlier ones' result). PatchError names the patch and the file."""
    result = {}
    for name, files in patches:
        for fp in files:
            current = result[fp.path] if fp.path in result else read(fp.old_path if not fp.creates else fp.path)
            try:
                result[fp.path] = apply_file(fp, current)
            except PatchError as e:
                raise PatchError('%s: %s' % (name, e)) from None
    return result
