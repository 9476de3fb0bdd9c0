// Vite config for an app on the tinyllm package. The package is a folder meant to be served as
// it is: its worker and wasm files load relative to tinyllm.js, so the build copies the folder
// into dist/tinyllm/ and leaves the import of 'tinyllm' pointing there, rather than letting the
// bundler re-chunk files that find each other at run time. In dev, Vite serves the package
// straight from node_modules (excluded from dependency pre-bundling for the same reason).
import { defineConfig } from 'vite';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative } from 'node:path';

const pkgDir = dirname(createRequire(import.meta.url).resolve('tinyllm'));
const served = '/tinyllm/tinyllm.js';

function files(dir) {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? files(p) : [p];
  });
}

function tinyllmPackage() {
  return {
    name: 'tinyllm-package',
    apply: 'build',
    enforce: 'pre',
    resolveId(id) {
      if (id === 'tinyllm') return { id: served, external: true };
    },
    generateBundle() {
      for (const f of files(pkgDir)) {
        const rel = relative(pkgDir, f);
        // The package's own chat page is not part of this app.
        if (rel.startsWith('chat/')) continue;
        this.emitFile({ type: 'asset', fileName: `tinyllm/${rel}`, source: readFileSync(f) });
      }
    },
  };
}

// Cross-origin isolation lets the CPU path use several threads (SharedArrayBuffer); without
// it the package runs the CPU on one thread.
const isolation = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
};

export default defineConfig({
  plugins: [tinyllmPackage()],
  optimizeDeps: { exclude: ['tinyllm'] },
  server: { headers: isolation },
  preview: { headers: isolation },
});
