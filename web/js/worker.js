// The engine's Web Worker: loads the wasm build, streams the model into it and answers the
// main thread's requests one at a time. Messages in: {id, op, ...}; out: {id, type:
// 'progress'|'chunk'|'done'|'error', ...}. A stop ({op: 'abort', target}) is seen between
// tokens: the engine hands the event loop a turn after each one.

import { TinyLLMError } from './errors.js';
import { openPart, clearCache, readPrefix } from './source.js';

let wasm = null; // the wasm-bindgen module, once initialized
let engine = null; // WebEngine
let info = null;
const stops = new Set();
/** The fetches of loads in progress, by request id (a stop aborts them). */
const fetches = new Map();
let queue = Promise.resolve();

/**
 * A module using relaxed SIMD (`i8x16.relaxed_swizzle`): it validates where the browser runs the
 * relaxed-SIMD builds (Chrome 114+, Firefox 145+; not Safari).
 */
const RELAXED_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 15, 1, 13, 0, 65, 1, 253, 15, 65, 2, 253, 15,
  253, 128, 2, 11,
]);

/** Whether this browser runs relaxed-SIMD WebAssembly. */
function hasRelaxedSimd() {
  try {
    return WebAssembly.validate(RELAXED_PROBE);
  } catch {
    return false;
  }
}

/**
 * The wasm build for this page: threaded where the page is cross-origin isolated and more than
 * one thread is asked for; relaxed SIMD where the browser has it, unless `kernels` is
 * 'simd128' (`kernels` 'relaxed' insists on it). The first load of a worker picks the build.
 */
async function initWasm(threads, kernels) {
  if (wasm) return wasm;
  if (!['auto', 'relaxed', 'simd128'].includes(kernels)) {
    throw new TinyLLMError('BAD_REQUEST', `cpuKernels must be 'auto', 'relaxed' or 'simd128', not '${kernels}'`, 'cpuKernels');
  }
  const relaxedHere = hasRelaxedSimd();
  if (kernels === 'relaxed' && !relaxedHere) {
    throw new TinyLLMError('BAD_REQUEST', 'this browser does not run relaxed-SIMD WebAssembly (use cpuKernels "auto" or "simd128")', 'cpuKernels');
  }
  // Relaxed first where the browser has it (the SIMD128 build is the fallback if it is missing).
  const flavours = kernels === 'relaxed' ? ['-relaxed'] : kernels === 'simd128' || !relaxedHere ? [''] : ['-relaxed', ''];
  const open = async (dir, n) => {
    const mod = await import(new URL(`./${dir}/tinyllm_web.js`, import.meta.url).href);
    await mod.default({ module_or_path: new URL(`./${dir}/tinyllm_web_bg.wasm`, import.meta.url) });
    if (n > 1) await mod.initThreadPool(n);
    return { mod, threads: n, build: dir };
  };
  const tried = [];
  const candidates = [];
  if (threads > 1 && self.crossOriginIsolated) for (const f of flavours) candidates.push([`wasm-mt${f}`, threads]);
  for (const f of flavours) candidates.push([`wasm${f}`, 1]);
  for (const [dir, n] of candidates) {
    try {
      wasm = await open(dir, n);
      if (tried.length) console.warn(`tinyllm: running the ${dir} build (${tried.join('; ')})`);
      return wasm;
    } catch (e) {
      // Not shipped, or the browser refused shared memory: the next one.
      tried.push(`${dir} unavailable: ${e && e.message}`);
    }
  }
  throw new TinyLLMError('INTERNAL', `no wasm build of the package could start: ${tried.join('; ')}`);
}

/**
 * What the worker knows of WebGPU here: the adapter `navigator.gpu` offers, and whether it is a
 * fallback (software) adapter, as SwiftShader, Chromium's CPU implementation of WebGPU, is:
 * `isFallbackAdapter`, or a vendor/architecture naming a CPU implementation.
 */
async function probeWebGpu() {
  if (!self.navigator || !navigator.gpu) return { adapter: null, why: 'the browser has no navigator.gpu' };
  let adapter = null;
  try {
    adapter = await navigator.gpu.requestAdapter();
  } catch (e) {
    return { adapter: null, why: `requestAdapter failed: ${e && e.message}` };
  }
  if (!adapter) return { adapter: null, why: 'the browser offers no WebGPU adapter' };
  const i = adapter.info || {};
  const text = `${i.vendor || ''} ${i.architecture || ''} ${i.device || ''} ${i.description || ''}`.toLowerCase();
  const software = /swiftshader|llvmpipe|lavapipe|softpipe|warp|\bcpu\b/.test(text);
  const fallback = i.isFallbackAdapter === true || adapter.isFallbackAdapter === true || software;
  const name = [i.vendor, i.architecture].filter(Boolean).join(' ') || 'unnamed adapter';
  return { adapter, fallback, name, f16: adapter.features.has('shader-f16') };
}

/** The most a wasm32 linear memory can hold. */
const WASM32_MAX = 4294967296;
/** The most bytes one `loader.push` copies into wasm memory. */
const PUSH_BYTES = 1 << 20;

/**
 * The device's memory where the browser says it (`navigator.deviceMemory`, GiB, rounded down
 * to a power of two); 0 when it does not, or says 8, the value Chrome caps every larger
 * device at.
 */
function deviceBytes() {
  const gib = self.navigator && navigator.deviceMemory;
  return typeof gib === 'number' && gib > 0 && gib < 8 ? gib * 2 ** 30 : 0;
}

/**
 * What a model will need, from its header alone (`TinyLLM.estimate`): the first MiB of the
 * file, more where the header is longer (a large vocabulary), never the tensors.
 */
async function estimate(o, signal) {
  const { mod } = await initWasm(1, 'auto');
  const source = Array.isArray(o.source) ? o.source[0] : o.source;
  let n = 1 << 20;
  for (;;) {
    const { bytes, size } = await readPrefix(source, n, signal);
    const out = JSON.parse(mod.estimateMemory(bytes, size, o.contextLength || 0));
    if (out.need_bytes === undefined) {
      out.file_bytes = size;
      out.limits = { wasm_bytes: WASM32_MAX, device_bytes: deviceBytes() || null };
      return out;
    }
    if (out.need_bytes <= bytes.length || out.need_bytes > 512 << 20) {
      throw new TinyLLMError('BAD_GGUF', `the GGUF header would need ${out.need_bytes} bytes`);
    }
    n = Math.max(out.need_bytes, 2 * n);
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
  const gpuOptions = o.webgpu || {};
  if (gpuOptions.f16 !== undefined && typeof gpuOptions.f16 !== 'boolean') {
    throw new TinyLLMError('BAD_REQUEST', `webgpu.f16 must be true or false, not ${JSON.stringify(gpuOptions.f16)}`, 'webgpu.f16');
  }
  // Why this backend: `info.backend_reason` says it.
  let reason;
  if (backend === 'auto') {
    const gpu = await probeWebGpu();
    if (!gpu.adapter) {
      backend = 'cpu';
      reason = `auto: ${gpu.why}; the wasm CPU runs the model`;
    } else if (gpu.fallback) {
      // A software WebGPU runs on the same CPU as the wasm path, many times slower.
      backend = 'cpu';
      reason = `auto: the only WebGPU adapter is a fallback (software) one (${gpu.name}); the wasm CPU is faster`;
    } else {
      backend = 'webgpu';
      reason = `auto: WebGPU adapter ${gpu.name}`;
    }
  } else if (backend === 'webgpu') {
    const gpu = await probeWebGpu();
    if (!gpu.adapter) throw new TinyLLMError('NO_WEBGPU', `${gpu.why} (use backend "cpu" or "auto")`);
    reason = `asked for webgpu: adapter ${gpu.name}${gpu.fallback ? ' (a fallback, software adapter)' : ''}`;
  } else {
    reason = 'asked for cpu';
  }
  const { mod } = await initWasm(backend === 'cpu' ? threads : 1, o.cpuKernels || 'auto');
  const parts = Array.isArray(o.source) ? o.source : [o.source];
  if (parts.length === 0) throw new TinyLLMError('BAD_REQUEST', 'no model source given', 'source');
  let loader;
  try {
    loader = await mod.ModelLoader.create(backend, parts.length, threads, gpuOptions.f16 !== false);
  } catch (e) {
    const err = TinyLLMError.from(e);
    if (o.backend === 'auto' && err.code === 'NO_WEBGPU') {
      backend = 'cpu';
      reason = `auto: WebGPU did not open (${err.message}); the wasm CPU runs the model`;
      loader = await mod.ModelLoader.create('cpu', parts.length, threads, true);
    } else {
      throw err;
    }
  }
  // Refuse, once the header is in, a model that cannot fit (INSUFFICIENT_MEMORY).
  loader.setLimits(o.contextSize || 0, WASM32_MAX, deviceBytes());
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
        // Each push copies its bytes into wasm memory: slices of at most PUSH_BYTES keep that
        // copy small whatever the source hands over at once (a cached Blob, a burst of fetch).
        for (let at = 0; at < chunk.byteLength; at += PUSH_BYTES) loader.push(chunk.subarray(at, at + PUSH_BYTES));
        loaded += chunk.byteLength;
        report('load', false);
      }
    } catch (e) {
      throw TinyLLMError.from(e);
    }
  }
  report('load', true);
  engine = await loader.finish(o.contextSize || 0, o.name || 'model');
  info = { ...JSON.parse(engine.info()), backend_reason: reason, wasm_build: wasm.build, threads: backend === 'cpu' ? wasm.threads : 1, cached: fromCache === parts.length, load_s: (performance.now() - started) / 1000 };
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
      case 'embeddings':
        data = JSON.parse(await needEngine().embeddings(JSON.stringify(m.request)));
        break;
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
      case 'estimate':
        fetches.set(id, new AbortController());
        data = await estimate(m, fetches.get(id).signal);
        break;
      case 'memory':
        // Linear memory only grows: its size now is the peak so far.
        data = { wasm_bytes: wasm ? wasm.mod.wasmMemoryBytes() : 0 };
        break;
      case 'profile':
        data = wasm ? JSON.parse(wasm.mod.cpuProfile(!!m.enable)) : null;
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
