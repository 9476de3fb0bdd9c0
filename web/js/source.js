// Model sources as streams of chunks: a URL (fetched with byte progress, resumed with HTTP
// Range after a dropped connection, kept in Cache Storage so a second load makes no network
// request), a Blob or File, or an ArrayBuffer. Runs in the engine's worker.

import { TinyLLMError } from './errors.js';

/** The Cache Storage bucket the package keeps models in. */
export const CACHE_NAME = 'tinyllm-models-v1';
/** Bytes handed to the engine at a time: never a whole file in one copy. */
const CHUNK = 4 << 20;
/** Range requests after a dropped connection before giving up. */
const RESUMES = 5;

function isCrossOrigin(url) {
  try {
    return new URL(url, self.location.href).origin !== self.location.origin;
  } catch {
    return false;
  }
}

async function fetchOk(url, init, what) {
  let res;
  try {
    res = await fetch(url, init);
  } catch (e) {
    if (init && init.signal && init.signal.aborted) throw new TinyLLMError('ABORTED', 'the load was aborted');
    if (isCrossOrigin(url)) {
      throw new TinyLLMError('CORS', `cannot fetch ${url}: the server does not allow this page's origin (CORS), or it is unreachable`);
    }
    throw new TinyLLMError('NETWORK', `cannot fetch ${url}: ${e.message}`);
  }
  if (res.status === 404) throw new TinyLLMError('NOT_FOUND', `${what} not found (404): ${url}`);
  if (!res.ok) throw new TinyLLMError('HTTP_ERROR', `${what}: HTTP ${res.status} ${res.statusText} from ${url}`);
  return res;
}

/** The total size of `url` from a response, or from a one-byte Range probe. */
async function sizeOf(url, res, signal) {
  const len = res.headers.get('content-length');
  if (len !== null && res.status === 200) return Number(len);
  const range = res.headers.get('content-range');
  const m = range && /\/(\d+)$/.exec(range);
  if (m) return Number(m[1]);
  const probe = await fetchOk(url, { headers: { Range: 'bytes=0-0' }, signal }, 'model file');
  const pr = probe.headers.get('content-range');
  const pm = pr && /\/(\d+)$/.exec(pr);
  await probe.body?.cancel();
  if (pm) return Number(pm[1]);
  throw new TinyLLMError('HTTP_ERROR', `${url}: the server says neither Content-Length nor Content-Range, so the file's size is unknown`);
}

/**
 * The body of `url` (first response `res`, `size` bytes) as a stream that survives dropped
 * connections: it asks for the rest with `Range: bytes=N-` and goes on where it stopped.
 */
function resumable(url, res, size, signal, onBytes) {
  let reader = res.body.getReader();
  let received = 0;
  let resumes = 0;
  return new ReadableStream({
    async pull(controller) {
      for (;;) {
        let r;
        try {
          r = await reader.read();
        } catch (e) {
          if (signal && signal.aborted) throw new TinyLLMError('ABORTED', 'the load was aborted');
          r = { done: true, error: e };
        }
        if (!r.done) {
          received += r.value.byteLength;
          if (received > size) {
            throw new TinyLLMError('TRUNCATED', `${url} sent more than its ${size} bytes`);
          }
          onBytes(r.value.byteLength);
          controller.enqueue(r.value);
          return;
        }
        if (received === size) {
          controller.close();
          return;
        }
        if (resumes++ >= RESUMES) {
          throw new TinyLLMError('TRUNCATED', `${url} ended after ${received} of ${size} bytes (${RESUMES} resumes failed)`);
        }
        const next = await fetchOk(url, { headers: { Range: `bytes=${received}-` }, signal }, 'model file');
        reader = next.body.getReader();
        if (next.status === 200) {
          // The server ignored the range: skip what we have.
          let skip = received;
          while (skip > 0) {
            const s = await reader.read();
            if (s.done) break;
            if (s.value.byteLength <= skip) {
              skip -= s.value.byteLength;
              continue;
            }
            const rest = s.value.subarray(skip);
            skip = 0;
            received += rest.byteLength;
            onBytes(rest.byteLength);
            controller.enqueue(rest);
            return;
          }
        }
      }
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
}

/** `stream` cut into chunks of at most CHUNK bytes; a consumer that stops early cancels it. */
async function* chunked(stream) {
  const reader = stream.getReader();
  let finished = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        finished = true;
        return;
      }
      for (let i = 0; i < value.byteLength; i += CHUNK) yield value.subarray(i, i + CHUNK);
    }
  } finally {
    if (!finished) await reader.cancel().catch(() => {});
  }
}

async function openCache() {
  try {
    return typeof caches === 'undefined' ? null : await caches.open(CACHE_NAME);
  } catch {
    return null; // e.g. an opaque origin
  }
}

/** Whether the origin's storage has room for `size` more bytes (unknown counts as yes). */
async function hasRoom(size) {
  try {
    const { quota, usage } = await navigator.storage.estimate();
    return quota === undefined || quota - (usage || 0) > size * 1.1;
  } catch {
    return true;
  }
}

/**
 * One part of a model as `{ size, chunks, cached }`: `chunks` an async iterator of
 * Uint8Arrays. `progress(phase, bytes)` is told of bytes downloaded (`download`) or read
 * (`read`).
 */
export async function openPart(part, { cache = true, signal, progress }) {
  if (part instanceof ArrayBuffer || ArrayBuffer.isView(part)) {
    const bytes = part instanceof ArrayBuffer ? new Uint8Array(part) : new Uint8Array(part.buffer, part.byteOffset, part.byteLength);
    return {
      size: bytes.byteLength,
      cached: false,
      chunks: (async function* () {
        for (let i = 0; i < bytes.byteLength; i += CHUNK) yield bytes.subarray(i, i + CHUNK);
      })(),
    };
  }
  if (typeof Blob !== 'undefined' && part instanceof Blob) {
    return { size: part.size, cached: false, chunks: chunked(part.stream()) };
  }
  const url = new URL(String(part), self.location.href).href;
  const store = cache ? await openCache() : null;
  if (store) {
    const hit = await store.match(url);
    if (hit && hit.headers.get('x-tinyllm-size')) {
      return { size: Number(hit.headers.get('x-tinyllm-size')), cached: true, chunks: chunked(hit.body) };
    }
  }
  const res = await fetchOk(url, { signal }, 'model file');
  const size = await sizeOf(url, res, signal);
  const body = resumable(url, res, size, signal, (n) => progress('download', n));
  if (store && (await hasRoom(size))) {
    // Keep the file first, then read it back: the download never waits on the engine, and
    // nothing is held twice in memory.
    const headers = { 'content-type': 'application/octet-stream', 'content-length': String(size), 'x-tinyllm-size': String(size) };
    try {
      await store.put(url, new Response(body, { headers }));
      const kept = await store.match(url);
      if (kept) return { size, cached: false, chunks: chunked(kept.body) };
    } catch (e) {
      if (e instanceof TinyLLMError) throw e;
      // Storage refused (quota): fetch again and stream without keeping a copy.
      const again = await fetchOk(url, { signal }, 'model file');
      return { size, cached: false, chunks: chunked(resumable(url, again, size, signal, (n) => progress('download', n))) };
    }
  }
  return { size, cached: false, chunks: chunked(body) };
}

/** Remove every model the package keeps in Cache Storage (or only `url`'s). */
export async function clearCache(url) {
  if (typeof caches === 'undefined') return false;
  if (url === undefined) return caches.delete(CACHE_NAME);
  const store = await caches.open(CACHE_NAME);
  return store.delete(new URL(String(url), self.location.href).href);
}

/**
 * The first `n` bytes of a model file and the file's size, without downloading the rest: a
 * Range request for a URL (a server that ignores Range sends the file from the start, and
 * the read stops after `n` bytes), a slice of a Blob or File, a view of an ArrayBuffer.
 */
export async function readPrefix(source, n, signal) {
  if (typeof source === 'string' || source instanceof URL) {
    const url = String(source);
    const res = await fetchOk(url, { headers: { Range: `bytes=0-${n - 1}` }, signal }, 'model file');
    const size = await sizeOf(url, res, signal);
    const reader = res.body.getReader();
    const out = new Uint8Array(Math.min(n, size));
    let got = 0;
    while (got < out.length) {
      const { done, value } = await reader.read();
      if (done) break;
      const take = Math.min(value.byteLength, out.length - got);
      out.set(value.subarray(0, take), got);
      got += take;
    }
    await reader.cancel().catch(() => {});
    return { bytes: out.subarray(0, got), size };
  }
  if (typeof Blob !== 'undefined' && source instanceof Blob) {
    return { bytes: new Uint8Array(await source.slice(0, n).arrayBuffer()), size: source.size };
  }
  if (source instanceof ArrayBuffer || ArrayBuffer.isView(source)) {
    const all = source instanceof ArrayBuffer ? new Uint8Array(source) : new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
    return { bytes: all.subarray(0, n), size: all.byteLength };
  }
  throw new TinyLLMError('BAD_REQUEST', 'a model source is a URL, a Blob or File, or an ArrayBuffer', 'source');
}
