import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    // test/reliability runs in its bounded form here (npm test); `npm run test:reliability` runs it in full
    include: ['test/unit/**/*.test.ts', 'test/integration/**/*.test.ts', 'test/reliability/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 60_000,
    pool: 'forks',
  },
});
