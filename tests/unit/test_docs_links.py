"""The documents hang together (issue 49): README.md is a first screen of at most 200 lines that links every page
under docs/; every relative link in README.md, CHANGELOG.md and docs/*.md reaches a file of the repository, and a
link's #anchor a heading of that file (GitHub's slugs); every section the program, its comments, stack files and
tests point an operator at - README or a page, then the section's title in double quotes - is a heading of that
page. (That each generated part is current: tests/unit/test_docs.py, tests/unit/config/test_stack_schema.py.)"""

import glob
import os
import re

import pytest

from tests.lablib import REPO

README_MAX_LINES = 200

# Where the program and its tests live: the files searched for a section they cite (besides the documents).
SOURCE_DIRS = ('components', 'resources', 'transport', 'hostscripts', 'config', 'provider', 'policy', 'tools', 'lab',
               'tests', 'monitoring', 'templates', 'fleet-monitoring', 'grammar', 'runtime', 'docs', '.ci')
SOURCE_SKIP_DIRS = {'__pycache__', 'golden', 'node_modules'}


def documents() -> list:
    """The markdown documents, relative to the repository: README.md, CHANGELOG.md, docs/*.md."""
    return ['README.md', 'CHANGELOG.md'] + sorted(os.path.relpath(p, REPO)
                                                  for p in glob.glob(os.path.join(REPO, 'docs', '*.md')))


def read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding='utf-8') as f:
        return f.read()


def prose(text: str) -> str:
    """The text with what markdown does not read as links blanked out: fenced code blocks (whole lines) and code
    spans (their content, so the brackets of `[10de:....]` are no link's), line structure kept."""
    lines, fence = [], None
    for line in text.split('\n'):
        mark = re.match(r'\s*(```|~~~)', line)
        if fence is None and mark:
            fence = mark.group(1)
            lines.append('')
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            lines.append('')
        else:
            lines.append(line)
    paragraphs = '\n'.join(lines).split('\n\n')
    blank = lambda m: m.group(1) + re.sub(r'[^\n]', ' ', m.group(2)) + m.group(1)  # noqa: E731
    return '\n\n'.join(re.sub(r'(`+)(.+?)\1', blank, p, flags=re.S) for p in paragraphs)


def headings(text: str) -> list:
    """(level, title) of every ATX heading outside fenced code blocks, in order."""
    found, fence = [], None
    for line in text.split('\n'):
        mark = re.match(r'\s*(```|~~~)', line)
        if fence is None and mark:
            fence = mark.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        m = re.match(r'(#{1,6})\s+(.*?)(?:\s+#+)?\s*$', line)
        if m:
            found.append((len(m.group(1)), m.group(2)))
    return found


def slug(title: str) -> str:
    """GitHub's anchor for a heading (github-slugger): lowercase, every character but letters, digits, `_`, `-`
    and spaces dropped, each space a `-`."""
    return re.sub(r'[^\w\- ]', '', title.lower()).replace(' ', '-')


def anchors(text: str) -> set:
    """Every anchor GitHub gives the headings of a document: a repeated slug gets -1, -2, ..."""
    seen, out = {}, set()
    for _, title in headings(text):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else '%s-%d' % (base, n))
    return out


LINK = re.compile(r'!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"]*")?\s*\)')


def links(text: str) -> list:
    """(line number, target) of every inline link and image."""
    body = prose(text)
    return [(body.count('\n', 0, m.start()) + 1, m.group(2)) for m in LINK.finditer(body)]


def broken_links(rel: str, text: str) -> list:
    """What is wrong with each relative link of one document, one line each."""
    problems = []
    here = os.path.dirname(os.path.join(REPO, rel))
    for line, target in links(text):
        if re.match(r'[a-z][a-z0-9+.-]*:', target, re.I):   # https:, mailto: - not ours to check
            continue
        path, _, anchor = target.partition('#')
        dest = os.path.normpath(os.path.join(here, path)) if path else os.path.join(REPO, rel)
        outside = os.path.relpath(dest, REPO).split(os.sep)[0] == '..'
        if outside or not os.path.exists(dest):
            problems.append('%s:%d: %s - no such file in the repository' % (rel, line, target))
            continue
        if anchor and dest.endswith('.md') and anchor not in anchors(read(os.path.relpath(dest, REPO))):
            problems.append('%s:%d: %s - %s has no heading with the anchor #%s' % (
                rel, line, target, os.path.relpath(dest, REPO), anchor))
    return problems


# ------------------------------------------------------------------------------------------------ the tests

def test_readme_is_a_first_screen():
    lines = read('README.md').count('\n')
    assert lines <= README_MAX_LINES, (
        'README.md has %d lines; it is the first screen (at most %d): move the detail into a page under docs/ and '
        'link it from "Where to read on"' % (lines, README_MAX_LINES))


def test_readme_links_every_page_under_docs():
    linked = {os.path.normpath(target.partition('#')[0]) for _, target in links(read('README.md'))}
    pages = [rel for rel in documents() if rel.startswith('docs' + os.sep)]
    assert len(pages) >= 8
    assert [p for p in pages if p not in linked] == [], 'pages README.md does not link (its "Where to read on")'


@pytest.mark.parametrize('rel', [d for d in documents() if d != os.path.join('docs', 'bench.md')])
def test_each_page_has_one_title(rel):
    """docs/bench.md is left out: its sections are written by the bench tools, each with its own title."""
    found = headings(read(rel))
    assert found and found[0][0] == 1, '%s does not start with a `# ` title' % rel
    assert [t for level, t in found[1:] if level == 1] == [], '%s has more than one `# ` title' % rel


@pytest.mark.parametrize('rel', documents())
def test_every_relative_link_resolves(rel):
    assert broken_links(rel, read(rel)) == []


def test_the_links_are_found_and_a_broken_one_is_caught():
    """The checker itself: links across lines and beside code spans are found; a missing file, a missing anchor and
    an anchor GitHub would spell otherwise are reported."""
    text = read('README.md')
    assert len(links(text)) >= 10 and len(links(read(os.path.join('docs', 'operator-guide.md')))) >= 1
    assert broken_links('README.md', text) == []
    bad = text + ('\nSee [the gone page](docs/no-such-page.md), [a gone section](docs/fleets.md#no-such-section), '
                  '[The first\n`up` on a bare host](docs/operator-guide.md#The-first-up-on-a-bare-host) and `[code](x.md)`.\n')
    assert [p.split(' - ')[0] for p in broken_links('README.md', bad)] == [
        'README.md:%d: docs/no-such-page.md' % (text.count('\n') + 2),
        'README.md:%d: docs/fleets.md#no-such-section' % (text.count('\n') + 2),
        'README.md:%d: docs/operator-guide.md#The-first-up-on-a-bare-host' % (text.count('\n') + 2)]
    assert slug('The model (`gpuhost:model`)') == 'the-model-gpuhostmodel'
    assert slug("Why API tokens are refused (and what the PCI mappings change)") == \
        'why-api-tokens-are-refused-and-what-the-pci-mappings-change'
    assert slug('Where state lives, and how to move it') == 'where-state-lives-and-how-to-move-it'


# -------------------------------------------------------------------------- sections the program points at

CITATION = re.compile(r'''(README(?:\.md)?|docs/[\w.-]+\.md)(?:'s)?,?:?\s*\(?"([^"]{2,120})"''')


def normalised(text: str) -> str:
    """Source text with its line continuations joined, so a citation broken over lines reads as one: a comment's
    next line (`#`, `//`), and Python's adjacent string literals ('...' '...')."""
    text = re.sub(r'''(['"])\s*\n\s*\1''', '', text)            # 'a ' \n 'b' -> 'a b'
    return re.sub(r'\s*\n\s*(?:#+|//)?\s*', ' ', text)


def source_files() -> list:
    files = [os.path.join(REPO, name) for name in os.listdir(REPO) if os.path.isfile(os.path.join(REPO, name))]
    for top in SOURCE_DIRS:
        for root, dirs, names in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d not in SOURCE_SKIP_DIRS and not d.startswith('.')]
            files += [os.path.join(root, n) for n in names]
    here = os.path.abspath(__file__).replace('.pyc', '.py')
    return sorted(f for f in files if os.path.abspath(f) != here and os.path.getsize(f) < 2 ** 20)


def citations() -> list:
    """(file, page, title) for every `README, "Title"` / `docs/<page>.md, "Title"` in the repository's text files."""
    found = []
    for path in source_files():
        try:
            with open(path, encoding='utf-8') as f:
                text = normalised(f.read())
        except UnicodeDecodeError:
            continue
        for m in CITATION.finditer(text):
            page = 'README.md' if m.group(1).startswith('README') else m.group(1)
            found.append((os.path.relpath(path, REPO), page, ' '.join(m.group(2).split())))
    return found


def cited_section_missing(page: str, title: str) -> bool:
    """A citation names a section by its title or by the start of it (`"Long steps"` for "Long steps: jobs on the
    host and in the container"), or by a part of it (`"if a run was interrupted"`): case, spacing and code marks
    aside."""
    if not os.path.exists(os.path.join(REPO, page)):
        return True
    plain = lambda s: ' '.join(s.replace('`', '').split()).lower()  # noqa: E731
    return not any(plain(title) in plain(t) for _, t in headings(read(page)))


def test_every_section_the_program_cites_is_a_heading_of_that_page():
    found = citations()
    wrong = sorted('%s: %s, "%s"' % c for c in found if cited_section_missing(c[1], c[2]))
    assert wrong == [], 'sections cited where the page has no such heading (move the citation with the text)'
    # The checker found what is there: the program's messages and the tests' comments among them.
    where = {(f, page) for f, page, _ in found}
    assert ('transport/proxmox.py', 'docs/operator-guide.md') in where
    assert ('resources/sglang.py', 'docs/operator-guide.md') in where
    assert ('templates/gpuhost.rules.yml.j2', 'docs/monitoring.md') in where
    assert ('tests/integration/test_fleet.py', 'docs/fleets.md') in where
    assert ('Pulumi.prod.yaml', 'README.md') in where
    assert len(found) >= 25


def test_a_citation_of_a_section_no_page_has_is_caught():
    assert cited_section_missing('docs/operator-guide.md', 'Adopting a running deployment') is False
    assert cited_section_missing('docs/operator-guide.md', 'Adopting a stopped deployment') is True
    assert cited_section_missing('docs/no-such-page.md', 'Anything') is True
    text = normalised("""raise Error('... take it in (docs/operator-guide.md, '
                 '"Adopting a running deployment"); otherwise ...')
    # (README, "Aim it at a
    # real host")""")
    assert [(m.group(1), m.group(2)) for m in CITATION.finditer(text)] == [
        ('docs/operator-guide.md', 'Adopting a running deployment'), ('README', 'Aim it at a real host')]
