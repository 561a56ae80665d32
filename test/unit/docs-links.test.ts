// The README and the guides stay navigable: every relative link points to a file (and heading)
// that exists, the README stays short, its SDK example is the example file the suite runs, and
// every error code has its entry in the troubleshooting guide. Reads files only.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const read = (path: string): string => readFileSync(join(root, path), 'utf8');

const documents = [
  'README.md',
  'CONTRIBUTING.md',
  'bench/results/README.md',
  ...readdirSync(join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

/** The text without fenced code blocks and inline code spans (links there are not links). */
function prose(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/`[^`\n]*`/g, 'code');
}

/** GitHub's anchors for a document's headings (lowercased, punctuation dropped, spaces to hyphens, repeats numbered). */
function anchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  const withoutCode = markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
  for (const [, text] of withoutCode.matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const base = text!
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .replace(/`/g, '')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** Relative link targets of a document: `[text](target)` and `[text]: target` outside code. */
function links(markdown: string): string[] {
  const text = prose(markdown);
  const inline = [...text.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]!);
  const references = [...text.matchAll(/^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$/gm)].map((m) => m[1]!);
  return [...inline, ...references].filter((t) => !/^[a-z][a-z0-9+.-]*:/i.test(t));
}

describe('documentation links', () => {
  it.each(documents)('every relative link in %s points to an existing file and heading', (doc) => {
    const markdown = read(doc);
    const broken: string[] = [];
    for (const target of links(markdown)) {
      const [path, fragment] = target.split('#', 2) as [string, string | undefined];
      const file = path === '' ? join(root, doc) : resolve(join(root, dirname(doc)), decodeURIComponent(path));
      if (!file.startsWith(root) || !existsSync(file)) {
        broken.push(`${target}: no such file`);
        continue;
      }
      if (fragment && file.endsWith('.md') && statSync(file).isFile() && !anchors(readFileSync(file, 'utf8')).has(fragment)) {
        broken.push(`${target}: no heading #${fragment} in ${relative(root, file)}`);
      }
    }
    expect(broken).toEqual([]);
  });

  it('finds the links it checks (the parser is not silently matching nothing)', () => {
    expect(links(read('README.md'))).toContain('docs/install.md');
    expect(links('see [a](b.md#c) and `[x](y)`\n```\n[p](q)\n```\n[r]: s.md')).toEqual(['b.md#c', 's.md']);
    expect([...anchors('# A `b`: c, d\n## A `b`: c, d\n')]).toEqual(['a-b-c-d', 'a-b-c-d-1']);
  });
});

describe('the README', () => {
  const readme = read('README.md');

  it('stays under 260 lines (everything else belongs in docs/)', () => {
    expect(readme.split('\n').length).toBeLessThan(260);
  });

  it('shows the SDK example exactly as examples/capture-restore.mjs has it (the suite runs that file)', () => {
    const block = /^```js\n([\s\S]*?)^```$/m.exec(readme)?.[1];
    expect(block, 'a ```js block in the README').toBeDefined();
    expect(block!.split('\n').length).toBeGreaterThan(10);
    expect(read('examples/capture-restore.mjs')).toContain(block!);
  });
});

it('docs/troubleshooting.md lists every error code of src/errors.ts', () => {
  const codes = [...read('src/errors.ts').matchAll(/^ {2}\| '(E_[A-Z_]+)'/gm)].map((m) => m[1]!);
  expect(codes.length).toBeGreaterThan(30);
  const guide = read('docs/troubleshooting.md');
  expect(codes.filter((code) => !guide.includes(`\`${code}\``))).toEqual([]);
});
