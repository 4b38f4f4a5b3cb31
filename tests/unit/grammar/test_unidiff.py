"""Unified diffs (grammar/unidiff.py): parsed and checked at preview, applied strictly in the container."""

import pytest

from grammar import unidiff

BASE = 'import os\n\n\ndef f():\n    return 1\n\n\ndef g():\n    return 2\n'
PATCH = '''diff --git a/sglang/srt/x.py b/sglang/srt/x.py
index 1111111..2222222 100644
--- a/sglang/srt/x.py
+++ b/sglang/srt/x.py
@@ -4,2 +4,2 @@
 def f():
-    return 1
+    return 10
@@ -8,2 +8,3 @@
 def g():
-    return 2
+    # SM120
+    return 20
'''


def apply(patch, files, name='p.patch'):
    return unidiff.apply_all([(name, unidiff.parse(patch))], files.get)


def test_git_diff_applies_with_its_prefixes_stripped():
    out = apply(PATCH, {'sglang/srt/x.py': BASE})
    assert out == {'sglang/srt/x.py': BASE.replace('return 1', 'return 10').replace('    return 2', '    # SM120\n'
                                                                                                 '    return 20')}


def test_hunks_apply_where_the_lines_moved_but_never_with_fuzz():
    moved = '# a new first line\n# and another\n' + BASE
    assert 'return 10' in apply(PATCH, {'sglang/srt/x.py': moved})['sglang/srt/x.py']
    changed = BASE.replace('def f():', 'def f(x):')
    with pytest.raises(unidiff.PatchError) as e:
        apply(PATCH, {'sglang/srt/x.py': changed}, name='sm120-fp4.patch')
    assert 'sm120-fp4.patch: sglang/srt/x.py: hunk 1 (@@ -4,2) does not apply' in str(e.value)


def test_new_and_deleted_files_and_no_newline_at_end():
    patch = ('--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+A = 1\n+B = 2\n\\ No newline at end of file\n'
             '--- a/pkg/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n')
    out = apply(patch, {'pkg/old.py': 'x = 1\n'})
    assert out == {'pkg/new.py': 'A = 1\nB = 2', 'pkg/old.py': None}


def test_a_later_patch_sees_the_earlier_ones():
    first = unidiff.parse('--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n')
    second = unidiff.parse('--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a = 2\n+a = 3\n')
    assert unidiff.apply_all([('1', first), ('2', second)], {'m.py': 'a = 1\n'}.get) == {'m.py': 'a = 3\n'}


@pytest.mark.parametrize('patch,words', [
    ('just some text\n', ['not a unified diff']),
    ('--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-root\n+evil\n', ['not a relative path']),
    ('--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-root\n+evil\n', ['not a relative path']),
    ('--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n', ['renames']),
    ('diff --git a/x b/y\nrename from x\nrename to y\n', ['renames and copies']),
    ('--- a/x.bin\n+++ b/x.bin\nGIT binary patch\n', ['binary']),
    ('--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a\n+b\n', ['1 old / 1 new lines, its header says 3 / 3']),
    ('--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a\n+b\nnot a hunk line\n', ['ends early']),
    ('--- a/x.py\n+++ b/x.py\n', ['has no hunk']),
    ('--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n--- a/x.py\n+++ b/x.py\n@@ -2 +2 @@\n-c\n+d\n', ['twice']),
])
def test_refused_at_preview(patch, words):
    with pytest.raises(unidiff.PatchError) as e:
        unidiff.parse(patch)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_refused_when_applied():
    with pytest.raises(unidiff.PatchError, match='no such file'):
        apply('--- a/missing.py\n+++ b/missing.py\n@@ -1 +1 @@\n-a\n+b\n', {})
    with pytest.raises(unidiff.PatchError, match='exists already'):
        apply('--- /dev/null\n+++ b/m.py\n@@ -0,0 +1 @@\n+a\n', {'m.py': 'x\n'})


def test_the_module_runs_ahead_of_the_builder_in_one_program():
    # Sent to the container as source, followed by the builder's: no __future__ import allowed.
    import inspect
    import re
    assert not re.search(r'^from __future__', inspect.getsource(unidiff), re.M)
