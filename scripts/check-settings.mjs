#!/usr/bin/env node
// Checks that src/ reads its VSNAP_* environment variables only in src/settings.ts, where each is
// checked and documented (docs/configuration.md): a read anywhere else is a setting nobody
// validates or lists. Catches `x.VSNAP_A`, `x['VSNAP_A']`, `{ VSNAP_A } = x`, `'VSNAP_A' in x`
// and a computed `process.env[name]`. Lines that are comments are skipped. Allows nothing else.
// Exits 1 and lists every read with its file and line.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const SRC = resolve(dirname(fileURLToPath(import.meta.url)), '../src');
/** The one module that may read VSNAP_* variables (relative to src/). */
export const SETTINGS_MODULE = 'settings.ts';

const NAME = 'VSNAP_[A-Za-z0-9_]*';
/** Each form of a read: its name in the report, and a pattern whose group `name` is the variable. */
const FORMS = [
  { form: 'property', pattern: new RegExp(`\\.\\s*(?<name>${NAME})`, 'g') },
  { form: 'index', pattern: new RegExp(`\\[\\s*(['"\`])(?<name>${NAME})\\1\\s*\\]`, 'g') },
  { form: 'in', pattern: new RegExp(`(['"\`])(?<name>${NAME})\\1\\s+in\\b`, 'g') },
  // `{ ..., VSNAP_A, ... } = x` and `{ VSNAP_A: a }: Env = x`: an object pattern naming one (a literal is never followed by `=`)
  { form: 'destructuring', pattern: /\{(?<keys>[^{}]*)\}\s*(?::[^=;{}()\n]*)?=(?![=>])/g, names: (keys) => [...keys.matchAll(new RegExp(`(?:^|[\\s,{])(?:\\.\\.\\.)?['"]?(${NAME})`, 'g'))].map((m) => m[1]) },
  // process.env[name]: which variable cannot be told, so it is read through settings.ts too
  { form: 'computed', pattern: /process\.env\s*\[(?!\s*(['"`])[^'"`$]*\1\s*\])/g, names: () => ['(computed)'] },
];

/** Blanks the lines that are comments (`//`, `/*`, ` *`), keeping line numbers. */
function withoutCommentLines(text) {
  return text
    .split('\n')
    .map((line) => (/^\s*(\/\/|\/\*|\*)/.test(line) ? '' : line))
    .join('\n');
}

/**
 * Every VSNAP_* read in `text` (TypeScript source): `{ line, variable, form }`, in order.
 * @param {string} text
 * @returns {Array<{ line: number, variable: string, form: string }>}
 */
export function findReads(text) {
  const code = withoutCommentLines(text);
  const reads = [];
  for (const { form, pattern, names } of FORMS) {
    for (const m of code.matchAll(pattern)) {
      const line = code.slice(0, m.index).split('\n').length;
      const found = names ? names(m.groups?.keys ?? '') : [m.groups.name];
      for (const variable of found) reads.push({ line, variable, form });
    }
  }
  return reads.sort((a, b) => a.line - b.line);
}

function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return walk(path);
    return /\.(c|m)?ts$/.test(name) ? [path] : [];
  });
}

/** Every read outside the settings module under `root` (src/ by default), as report lines. */
export function check(root = SRC) {
  const problems = [];
  let files = 0;
  for (const file of walk(root)) {
    files++;
    const rel = relative(root, file).split('\\').join('/');
    if (rel === SETTINGS_MODULE) continue;
    for (const r of findReads(readFileSync(file, 'utf8'))) {
      const what = r.variable === '(computed)' ? 'reads process.env with a computed name' : `reads $${r.variable} (${r.form})`;
      problems.push(`src/${rel}:${r.line}: ${what}: read it through src/${SETTINGS_MODULE}, which checks it, and list it in docs/configuration.md`);
    }
  }
  return { problems, files };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { problems, files } = check();
  if (problems.length) {
    console.error(`settings: ${problems.length} VSNAP_* read(s) outside src/${SETTINGS_MODULE}:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    process.exit(1);
  }
  console.log(`settings: ${files} files, every VSNAP_* variable read in src/${SETTINGS_MODULE}`);
}
