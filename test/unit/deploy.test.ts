import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';

import { packageRoot } from '../../src/native/index.js';
import { parseConfig } from '../../src/serve/config.js';

// The deployment files cannot be built or run here (no Docker, Kubernetes or GPU): these checks
// keep their syntax, their cross-references and the vsnap configuration they carry valid.
const dir = join(packageRoot(), 'deploy');
const read = (f: string) => readFileSync(join(dir, f), 'utf8');

type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

describe('deploy/', () => {
  it('vsnap.yaml is a valid vsnap serve configuration with two child engines', () => {
    const config = parseConfig(read('vsnap.yaml'), 'deploy/vsnap.yaml', { VSNAP_TOKEN: 't', VSNAP_CONTROL_TOKEN: 'c' });
    const models = Object.values(config.models) as Obj[];
    expect(models).toHaveLength(2);
    for (const m of models) expect(m.command).toBe('vllm');
    expect(config.listen).toEqual({ host: '0.0.0.0', port: 8080, allowedHosts: ['vsnap', '.svc', '.svc.cluster.local'], bodyStallSeconds: 10, responseStallSeconds: 30 });
    expect(config.store).toBe('/var/lib/vsnap');
  });

  it('Dockerfile: known instructions, a pinned vllm/vllm-openai base, stages that exist, vsnap as entrypoint', () => {
    const known = new Set(['FROM', 'ARG', 'ENV', 'RUN', 'COPY', 'ADD', 'WORKDIR', 'EXPOSE', 'VOLUME', 'HEALTHCHECK', 'ENTRYPOINT', 'CMD', 'USER', 'LABEL', 'STOPSIGNAL', 'SHELL']);
    const logical: string[] = [];
    let current = '';
    for (const line of read('Dockerfile').split('\n')) {
      if (!current && (line.trim() === '' || line.trimStart().startsWith('#'))) continue;
      current += line.replace(/\\$/, ' ');
      if (!line.endsWith('\\')) {
        logical.push(current.trim());
        current = '';
      }
    }
    expect(current, 'a continuation runs off the end').toBe('');
    const stages = new Set<string>();
    const args = new Map<string, string>();
    for (const l of logical) {
      const [instruction] = l.split(/\s+/, 1);
      expect(known.has(instruction!), `unknown instruction in: ${l}`).toBe(true);
      const arg = /^ARG (\w+)=(\S+)$/.exec(l);
      if (arg) args.set(arg[1]!, arg[2]!);
      const from = /^FROM (\S+)(?: AS (\w+))?$/.exec(l);
      if (l.startsWith('FROM')) expect(from, l).not.toBeNull();
      if (from?.[2]) stages.add(from[2]);
      const copyFrom = /--from=(\S+)/.exec(l);
      if (copyFrom) expect(stages.has(copyFrom[1]!), `COPY --from=${copyFrom[1]} names no stage`).toBe(true);
      for (const json of [/^(?:ENTRYPOINT|CMD|VOLUME) (\[.*\])$/.exec(l)?.[1], /CMD (\[.*\])$/.exec(l)?.[1]]) if (json) JSON.parse(json);
    }
    expect(args.get('VLLM_IMAGE')).toMatch(/^vllm\/vllm-openai:v\d+\.\d+\.\d+$/);
    expect(logical.at(-2)).toBe('ENTRYPOINT ["vsnap"]');
    expect(logical.some((l) => l.includes('pip install') && l.includes('engines/vllm'))).toBe(true);
  });

  it('compose.yaml: one vsnap service with the GPU, /dev/shm, the store and a /healthz check', () => {
    const compose = parse(read('compose.yaml')) as Obj;
    const svc = compose.services.vsnap as Obj;
    expect(svc.build).toEqual({ context: '..', dockerfile: 'deploy/Dockerfile' });
    expect(svc.deploy.resources.reservations.devices[0].capabilities).toEqual(['gpu']);
    expect(svc.shm_size).toMatch(/^\d+gb$/);
    expect(svc.healthcheck.test.join(' ')).toMatch(/\/healthz/);
    for (const v of svc.volumes as string[]) {
      const [source] = v.split(':');
      if (source!.startsWith('./')) expect(() => read(source!.slice(2))).not.toThrow();
      else expect(compose.volumes).toHaveProperty(source!);
    }
    expect(svc.volumes).toContain('./vsnap.yaml:/etc/vsnap/vsnap.yaml:ro');
  });

  it('kubernetes.yaml: a PVC, one pod running vsnap serve with GPU, shm and store, liveness on /healthz', () => {
    const docs = parseAllDocuments(read('kubernetes.yaml')).map((d) => {
      expect(d.errors).toEqual([]);
      return d.toJS() as Obj;
    });
    for (const d of docs) {
      expect(d.apiVersion).toBeTruthy();
      expect(d.metadata.name).toBeTruthy();
    }
    const kinds = docs.map((d) => d.kind);
    expect(kinds).toEqual(['PersistentVolumeClaim', 'Deployment', 'Service']);
    const deployment = docs[1]!;
    expect(deployment.spec.replicas).toBe(1);
    const pod = deployment.spec.template.spec as Obj;
    const c = pod.containers[0] as Obj;
    expect(c.args.slice(0, 1)).toEqual(['serve']);
    expect(c.livenessProbe.httpGet.path).toBe('/healthz');
    expect(c.resources.limits['nvidia.com/gpu']).toBe('1');
    const volumes = new Map((pod.volumes as Obj[]).map((v) => [v.name, v]));
    const mounts = new Map((c.volumeMounts as Obj[]).map((m) => [m.mountPath, m.name]));
    expect(volumes.get(mounts.get('/dev/shm'))?.emptyDir.medium).toBe('Memory');
    expect(volumes.get(mounts.get('/var/lib/vsnap'))?.persistentVolumeClaim.claimName).toBe(docs[0]!.metadata.name);
    expect(docs[2]!.spec.selector).toEqual(deployment.spec.selector.matchLabels);
  });

  it('vsnap.service: a well-formed systemd unit that runs vsnap serve', () => {
    const sections = new Map<string, Map<string, string>>();
    let section: Map<string, string> | undefined;
    for (const [i, raw] of read('vsnap.service').split('\n').entries()) {
      const line = raw.trim();
      if (line === '' || line.startsWith('#')) continue;
      const header = /^\[(\w+)\]$/.exec(line);
      if (header) {
        section = new Map();
        sections.set(header[1]!, section);
        continue;
      }
      const kv = /^([A-Za-z]+)=(.*)$/.exec(line);
      expect(kv && section, `line ${i + 1}: ${line}`).toBeTruthy();
      section!.set(kv![1]!, kv![2]!);
    }
    expect([...sections.keys()]).toEqual(['Unit', 'Service', 'Install']);
    const service = sections.get('Service')!;
    expect(service.get('ExecStart')).toMatch(/vsnap serve --config \/etc\/vsnap\/vsnap\.yaml$/);
    expect(service.get('KillMode')).toBe('mixed');
    expect(service.get('StateDirectory')).toBe('vsnap');
    expect(sections.get('Install')!.get('WantedBy')).toBe('multi-user.target');
  });
});
