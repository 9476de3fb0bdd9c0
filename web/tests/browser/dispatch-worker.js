// A module worker for the hand-off measurement: the threaded build's measureDispatch (it
// blocks, which only a worker may).
self.onmessage = async ({ data }) => {
  try {
    const mod = await import(`/pkg/${data.build}/tinyllm_web.js`);
    await mod.default({ module_or_path: `/pkg/${data.build}/tinyllm_web_bg.wasm` });
    await mod.initThreadPool(data.threads);
    // A first round wakes everything up; then back-to-back ops and ops after serial work.
    mod.measureDispatch(200, 0);
    const out = [];
    for (const serial of data.serial) out.push(JSON.parse(mod.measureDispatch(data.ops, serial)));
    self.postMessage(out);
  } catch (e) {
    self.postMessage({ error: String(e && e.message || e) });
  }
};
