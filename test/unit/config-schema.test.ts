import { readFileSync } from 'node:fs';

import { describe, expect, it } from 'vitest';

import { loadConfig } from '../../src/serve/config.js';
import { CONFIG_KEYS } from '../../scripts/config-reference.js';
import { configJsonSchema, configReference, REFERENCE_PATH, SCHEMA_PATH, schemaKeys } from '../../scripts/config-schema.js';

describe('the JSON Schema and the reference of the serve configuration', () => {
  it('are generated from the zod schema and committed up to date (`npm run schema` regenerates them)', () => {
    expect(readFileSync(SCHEMA_PATH, 'utf8')).toBe(configJsonSchema());
    expect(readFileSync(REFERENCE_PATH, 'utf8')).toBe(configReference());
  });

  it('describe every key, and nothing that is not a key', () => {
    const keys = schemaKeys();
    expect(keys).toContain('models.*.healthPath');
    expect(keys.filter((k) => !CONFIG_KEYS[k])).toEqual([]);
    expect(Object.keys(CONFIG_KEYS).filter((k) => !keys.includes(k))).toEqual([]);
  });

  it('the quick-start example is a valid configuration that points at the schema', () => {
    const config = loadConfig('examples/quickstart/serve.yaml', { HOME: '/home/someone' });
    expect(Object.keys(config.models)).toEqual(['reference-a', 'reference-b']);
    expect(config.store).toBe('/home/someone/.local/share/vsnap-quickstart');
    expect(readFileSync('examples/quickstart/serve.yaml', 'utf8')).toMatch(/^# yaml-language-server: \$schema=\.\.\/\.\.\/schema\/serve-config\.schema\.json/);
  });
});
