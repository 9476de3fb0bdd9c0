// Errors the package throws: a TinyLLMError with a machine-readable `code`, the same codes
// whether the failure happened in this thread, in the worker or in the wasm engine.
//
//   NOT_FOUND, HTTP_ERROR, CORS, NETWORK     fetching the model
//   NOT_GGUF, TRUNCATED, BAD_GGUF            the file is not a usable GGUF model
//   UNSUPPORTED_ARCH, BAD_MODEL              a GGUF model this build cannot run
//   NO_WEBGPU, GPU_OUT_OF_MEMORY             the device
//   INSUFFICIENT_MEMORY                      the model cannot fit the tab or the device
//   BAD_REQUEST, CONTEXT_LENGTH_EXCEEDED     the request (`param` names the field)
//   ABORTED                                  the caller's AbortSignal fired
//   UNLOADED, WORKER_CRASHED, INTERNAL       everything else

export class TinyLLMError extends Error {
  constructor(code, message, param) {
    super(message);
    this.name = code === 'ABORTED' ? 'AbortError' : 'TinyLLMError';
    this.code = code;
    if (param !== undefined && param !== null) this.param = param;
  }

  /** The plain object that crosses postMessage. */
  toJSON() {
    return { code: this.code, message: this.message, param: this.param };
  }

  /** A TinyLLMError from anything thrown (an error object from the wasm engine keeps its code). */
  static from(e, fallback = 'INTERNAL') {
    if (e instanceof TinyLLMError) return e;
    if (e && typeof e === 'object' && typeof e.code === 'string' && /^[A-Z_]+$/.test(e.code)) {
      return new TinyLLMError(e.code, String(e.message ?? e.code), e.param);
    }
    return new TinyLLMError(fallback, String((e && e.message) || e));
  }
}
