// The engine's Web Worker: loads the wasm build, streams the model into it and answers the
// main thread's requests one at a time. Messages in: {id, op, ...}; out: {id, type:
// 'progress'|'chunk'|'done'|'error', ...}. A stop ({op: 'abort', target}) is seen between
// tokens: the engine hands the event loop a turn after each one.

import { TinyLLMError } from './errors.js';
import { openPart, clearCache } from './source.js';

let wasm = null; // the wasm-bindgen module, once initialized
let engine = null; // WebEngine
let info = null;
const stops = new Set();
/** The fetches of loads in progress, by request id (a stop aborts them). */
const fetches = new Map();
let queue = Promise.resolve();

/** The wasm build for this page: threaded where the page is cross-origin isolated. */
async function initWasm(threads) {
  if (wasm) return wasm;
  const mtUrl = new URL('./wasm-mt/tinyllm_web.js', import.meta.url);
  if (threads > 1 && self.crossOriginIsolated) {
    try {
      const mod = await import(mtUrl.href);
      await mod.default({ module_or_path: new URL('./wasm-mt/tinyllm_web_bg.wasm', import.meta.url) });
      await mod.initThreadPool(threads);
      wasm = { mod, threads };
      return wasm;
    } catch (e) {
      // No threaded build shipped, or the browser refused shared memory: one thread.
      console.warn('tinyllm: threaded wasm unavailable, running on one thread:', e && e.message);
    }
  }
  const mod = await import(new URL('./wasm/tinyllm_web.js', import.meta.url).href);
  await mod.default({ module_or_path: new URL('./wasm/tinyllm_web_bg.wasm', import.meta.url) });
  wasm = { mod, threads: 1 };
  return wasm;
}

async function hasWebGpu() {
  if (!self.navigator || !navigator.gpu) return false;
  try {
    return (await navigator.gpu.requestAdapter()) !== null;
  } catch {
    return false;
  }
}

function post(msg) {
  self.postMessage(msg);
}

async function load(id, o, stop) {
  if (engine) {
    // A new model replaces the one held: free it first.
    engine.unload();
    engine = null;
    info = null;
  }
  const threads = Math.max(1, o.threads || (self.navigator && navigator.hardwareConcurrency) || 1);
  let backend = o.backend || 'auto';
  if (!['auto', 'webgpu', 'cpu'].includes(backend)) {
    throw new TinyLLMError('BAD_REQUEST', `backend must be 'auto', 'webgpu' or 'cpu', not '${backend}'`, 'backend');
  }
  if (backend === 'auto') backend = (await hasWebGpu()) ? 'webgpu' : 'cpu';
  else if (backend === 'webgpu' && !(await hasWebGpu())) {
    throw new TinyLLMError('NO_WEBGPU', 'this browser offers no WebGPU adapter (use backend "cpu" or "auto")');
  }
  const { mod } = await initWasm(backend === 'cpu' ? threads : 1);
  const parts = Array.isArray(o.source) ? o.source : [o.source];
  if (parts.length === 0) throw new TinyLLMError('BAD_REQUEST', 'no model source given', 'source');
  let loader;
  try {
    loader = await mod.ModelLoader.create(backend, parts.length, threads);
  } catch (e) {
    const err = TinyLLMError.from(e);
    if (o.backend === 'auto' && err.code === 'NO_WEBGPU') {
      backend = 'cpu';
      loader = await mod.ModelLoader.create('cpu', parts.length, threads);
    } else {
      throw err;
    }
  }
  const started = performance.now();
  let downloaded = 0;
  let loaded = 0;
  let total = 0;
  let last = 0;
  const report = (phase, force) => {
    const now = performance.now();
    if (!force && now - last < 100) return;
    last = now;
    const seconds = (now - started) / 1000;
    const bytes = phase === 'download' ? downloaded : loaded;
    post({ id, type: 'progress', data: { phase, loaded: bytes, total, mbps: seconds > 0 ? bytes / 1e6 / seconds : 0 } });
  };
  const progress = (phase, n) => {
    downloaded += n;
    report(phase, false);
  };
  let fromCache = 0;
  for (let i = 0; i < parts.length; i++) {
    const part = await openPart(parts[i], { cache: o.cache !== false, progress, signal: fetches.get(id).signal });
    if (part.cached) fromCache++;
    total += part.size;
    try {
      loader.begin(part.size);
      for await (const chunk of part.chunks) {
        if (stop()) throw new TinyLLMError('ABORTED', 'the load was aborted');
        loader.push(chunk);
        loaded += chunk.byteLength;
        report('load', false);
      }
    } catch (e) {
      throw TinyLLMError.from(e);
    }
  }
  report('load', true);
  engine = await loader.finish(o.contextSize || 0, o.name || 'model');
  info = { ...JSON.parse(engine.info()), threads: backend === 'cpu' ? wasm.threads : 1, cached: fromCache === parts.length, load_s: (performance.now() - started) / 1000 };
  return info;
}

function needEngine() {
  if (!engine) throw new TinyLLMError('UNLOADED', 'no model is loaded');
  return engine;
}

async function handle(m) {
  const { id } = m;
  const stop = () => stops.has(id);
  try {
    if (stop()) throw new TinyLLMError('ABORTED', 'the request was aborted before it started');
    let data;
    switch (m.op) {
      case 'load':
        fetches.set(id, new AbortController());
        data = await load(id, m, stop);
        break;
      case 'chat':
      case 'completion': {
        const e = needEngine();
        const run = m.op === 'chat' ? e.chat.bind(e) : e.completion.bind(e);
        const out = await run(JSON.stringify(m.request), (chunk) => post({ id, type: 'chunk', data: chunk }), stop);
        data = out === null ? null : JSON.parse(out);
        break;
      }
      case 'generate':
        data = JSON.parse(await needEngine().generate(JSON.stringify(m.options), stop));
        break;
      case 'tokenize':
        data = Array.from(needEngine().tokenize(m.text, m.addSpecial !== false, m.parseSpecial !== false));
        break;
      case 'detokenize':
        data = needEngine().detokenize(Uint32Array.from(m.ids));
        break;
      case 'info':
        data = info;
        break;
      case 'memory':
        // Linear memory only grows: its size now is the peak so far.
        data = { wasm_bytes: wasm ? wasm.mod.wasmMemoryBytes() : 0 };
        break;
      case 'clearCache':
        data = await clearCache(m.url);
        break;
      case 'unload':
        if (engine) engine.unload();
        engine = null;
        info = null;
        data = true;
        break;
      default:
        throw new TinyLLMError('BAD_REQUEST', `unknown operation '${m.op}'`);
    }
    if (stop()) throw new TinyLLMError('ABORTED', 'the request was aborted');
    post({ id, type: 'done', data });
  } catch (e) {
    post({ id, type: 'error', error: TinyLLMError.from(e).toJSON() });
  } finally {
    stops.delete(id);
    // A load that failed may leave a download running: stop it.
    fetches.get(id)?.abort();
    fetches.delete(id);
  }
}

self.onmessage = (ev) => {
  const m = ev.data;
  if (m.op === 'abort') {
    stops.add(m.target);
    fetches.get(m.target)?.abort();
    return;
  }
  queue = queue.then(() => handle(m));
};
