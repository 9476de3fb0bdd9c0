// Drives the chat page (web/chat/) in headless Chromium, on either transport:
//   node chat_page.mjs URL SHOT_PREFIX
// URL is the page under `tinyllm-native serve` (HTTP transport), or the npm package's
// chat/index.html with `?model=...` (the model runs in the page's Web Worker). The model must
// be tests/common's thinking fixture (its prompt opens <think> after "Think first.").
// Sends two messages (greedy, short) and checks each streamed answer equals the non-streamed
// answer to the same conversation (the API, or the package called directly); a refused
// request (HTTP) leaves no trace; the conversation is kept in IndexedDB and comes back after a
// reload; Stop ends an answer early and the next message is answered; reasoning streams open
// and is folded after. Screenshots (SHOT_PREFIX-conversation.png, -reasoning.png) are checked
// to be real, non-blank PNGs. Exits non-zero with a reason on any failure. Run by
// native/tests/browser.rs and web/tests/browser.rs.
import { chromium } from "playwright-core";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const url = process.argv[2];
if (!url) throw new Error("usage: node chat_page.mjs URL SHOT_PREFIX");
const profile = mkdtempSync(join(tmpdir(), "tinyllm-chromium-"));
const shotPrefix = process.argv[3] || join(profile, "chat");
const THINK = "Think first.";
const MAX_TOKENS = 16;
const VIEWPORT = { width: 1000, height: 700 };

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

const idle = (page) => page.waitForFunction(() => document.getElementById("send").textContent === "Send");
const lastAnswer = (page) =>
  page.$$eval(".msg.assistant", (els) => {
    const a = els.at(-1);
    const body = a.querySelector(":scope > .body");
    const details = a.querySelector(":scope > details.reasoning");
    return {
      raw: body.dataset.raw,
      html: body.innerHTML,
      reasoning: details.hidden ? "" : details.querySelector("div").textContent,
      open: details.open,
      stats: a.querySelector(".stats")?.textContent ?? null,
      stopped: a.querySelector(".stopped") !== null,
    };
  });

/** The text of the last error bubble, or null (without waiting for one to appear). */
const errorShown = (page) =>
  page.evaluate(() => [...document.querySelectorAll(".msg.error")].at(-1)?.textContent ?? null);

async function send(page, text) {
  await page.fill("#input", text);
  await page.press("#input", "Enter");
}

// A request the server refuses (503, as when its queue is full): the page shows the error,
// leaves no empty answer behind, and does not send the failed turn with the next message.
async function failedTurn(page) {
  const message = "the server is busy: try again";
  refusing = true;
  await page.route("**/v1/chat/completions", (r) =>
    r.fulfill({ status: 503, contentType: "application/json", headers: { "Retry-After": "1" },
      body: JSON.stringify({ error: { message, type: "server_error", param: null, code: "overloaded" } }) }));
  const before = await page.$$eval(".msg.assistant", (els) => els.length);
  await send(page, "This one fails.");
  await page.waitForSelector(".msg.error");
  await idle(page);
  const shown = await page.textContent(".msg.error");
  check(shown === message, `error bubble shows ${JSON.stringify(shown)}`);
  const after = await page.$$eval(".msg.assistant", (els) => els.length);
  check(after === before, `a failed request left ${after - before} empty answer bubble(s)`);
  await page.unroute("**/v1/chat/completions");
  refusing = false;
}

/** The non-streamed answer to `messages`, from the API or from the package itself. */
async function reference(page, transport, messages) {
  if (transport === "http") {
    const api = await fetch(new URL("/v1/chat/completions", url), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages, temperature: 0, max_tokens: MAX_TOKENS }),
    });
    const raw = await api.text();
    check(api.ok, `API: ${api.status} ${raw}`);
    return JSON.parse(raw);
  }
  return page.evaluate(
    (m) => window.tinyllmChat.transport.llm.chat.completions.create({ messages: m, temperature: 0, max_tokens: 16 }),
    messages,
  );
}

/** Checks a screenshot is a real PNG of the viewport with something drawn on it. */
async function checkShot(context, path) {
  const png = readFileSync(path);
  check(png.subarray(0, 8).equals(Buffer.from([137, 80, 78, 71, 13, 10, 26, 10])), "screenshot is not a PNG");
  check(png.subarray(12, 16).toString("latin1") === "IHDR", "PNG without IHDR first");
  const [w, h] = [png.readUInt32BE(16), png.readUInt32BE(20)];
  check(w === VIEWPORT.width && h === VIEWPORT.height, `screenshot is ${w}x${h}`);
  check(png.length > 5000, `screenshot is only ${png.length} bytes`);
  // Decode it with the browser's own PNG decoder in a blank tab, and measure the pixels.
  const probe = await context.newPage();
  const pixels = await probe.evaluate(async (b64) => {
    const blob = await (await fetch(`data:image/png;base64,${b64}`)).blob();
    const bmp = await createImageBitmap(blob);
    const c = new OffscreenCanvas(bmp.width, bmp.height);
    const g = c.getContext("2d");
    g.drawImage(bmp, 0, 0);
    const d = g.getImageData(0, 0, bmp.width, bmp.height).data;
    let sum = 0, sq = 0;
    const colors = new Set();
    for (let i = 0; i < d.length; i += 4) {
      const y = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2];
      sum += y; sq += y * y;
      colors.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
    }
    const n = d.length / 4;
    return { mean: sum / n, variance: sq / n - (sum / n) ** 2, colors: colors.size };
  }, png.toString("base64"));
  await probe.close();
  // Text on a plain background: a few percent of dark pixels on light gives variance in the
  // hundreds; a blank page gives 0 and one color.
  check(pixels.variance > 50 && pixels.colors > 20, `the screenshot ${path} looks blank: ${JSON.stringify(pixels)}`);
  console.log(`screenshot ${path}: ${w}x${h}, ${png.length} bytes, ` +
    `luma mean ${pixels.mean.toFixed(1)} variance ${pixels.variance.toFixed(1)}, ${pixels.colors} colors`);
}

// Flags from docs/design.md (headless, no sandbox, WebGPU, nothing reaching out of the machine);
// the persistent context is what gives Chromium our fresh, empty --user-data-dir.
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: VIEWPORT,
  timeout: 60_000,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan",
    "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});

const problems = [];
let refusing = false;
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(90_000);
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // The refused request of failedTurn is logged as a failed resource load; nothing else may be.
    if (m.type() === "error" && !(refusing && m.text().includes("status of 503"))) problems.push(`console error: ${m.text()} (${m.location().url})`);
  });
  const streams = [];
  const sent = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/v1/chat/completions")) sent.push(r.postDataJSON());
  });
  page.on("response", (r) => {
    if (r.url().endsWith("/v1/chat/completions")) streams.push(r.headers()["content-type"] || "");
  });

  const res = await page.goto(url);
  check(res && res.status() === 200, `GET ${url}: ${res && res.status()}`);
  check((await page.title()) === "tinyllm chat", `title ${await page.title()}`);
  await page.waitForFunction(() => window.tinyllmChat !== undefined);
  const transport = await page.evaluate(() => window.tinyllmChat.transport.kind);
  // The header shows the model: the id from /v1/models, or the loaded file's once loaded.
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0 ||
    document.querySelector(".msg.error") !== null);
  check((await errorShown(page)) === null, `loading failed: ${await errorShown(page)}`);
  const modelId = await page.textContent("#model");
  if (transport === "worker") {
    const progress = await page.evaluate(() => [document.getElementById("progress").value, document.getElementById("progress-text").textContent]);
    check(progress[0] === 1 && /[\d.]+ \/ [\d.]+ MB, [\d.]+ MB\/s/.test(progress[1]),
      `the progress bar did not show the load: ${JSON.stringify(progress)}`);
  }

  // Greedy and short, so the reference gives the same answer.
  await page.fill("#temperature", "0");
  await page.fill("#max_tokens", String(MAX_TOKENS));

  const history = [];
  for (const [turn, text] of ["Hello there, who are you?", "Tell me more."].entries()) {
    if (turn === 1 && transport === "http") await failedTurn(page);
    // Count how often the answer's text changes while it streams in.
    await page.evaluate(() => {
      window.__updates = 0;
      if (window.__observer) window.__observer.disconnect();
      window.__observer = new MutationObserver((records) => { window.__updates += records.length; });
      window.__observer.observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
    });
    await send(page, text);
    // Finished: the usage line comes with the last chunk; the button reads Send again.
    await page.waitForFunction(
      ([n, errors]) =>
        document.querySelectorAll(".msg.assistant .stats").length === n ||
        document.querySelectorAll(".msg.error").length > errors,
      [turn + 1, turn && transport === "http" ? 1 : 0],
    );
    await idle(page);
    const errors = await page.$$eval(".msg.error", (els) => els.map((e) => e.textContent));
    check(errors.length === (turn && transport === "http" ? 1 : 0), `the page shows an error: ${errors.at(-1)}`);

    const bubbles = await page.$$eval(".msg:not(.error)", (els) => els.map((e) => [e.className, e.className === "msg user" ? e.textContent : ""]));
    const answers = bubbles.filter(([c]) => c === "msg assistant").length;
    const [me, it] = bubbles.slice(-2);
    check(answers === turn + 1 && me[0] === "msg user" && me[1] === text && it[0] === "msg assistant",
      `bubbles after turn ${turn + 1}: ${JSON.stringify(bubbles)}`);
    const shown = await lastAnswer(page);
    check(shown.raw.trim().length > 0 && shown.html.length > 0, `the streamed answer is empty: ${JSON.stringify(shown)}`);

    history.push({ role: "user", content: text });
    if (transport === "http") {
      const request = sent.at(-1);
      check(JSON.stringify(request.messages) === JSON.stringify(history),
        `the page sent ${JSON.stringify(request.messages)}, the conversation is ${JSON.stringify(history)}`);
      check(request.stream === true && request.temperature === 0 && request.max_tokens === MAX_TOKENS,
        `the page's settings were not sent: ${JSON.stringify(request)}`);
    }
    const v = await reference(page, transport, history);
    const want = v.choices[0].message.content;
    check(shown.raw === want, `page shows ${JSON.stringify(shown.raw)}, the non-streamed answer is ${JSON.stringify(want)}`);
    const tokens = Number(/(\d+) generated/.exec(shown.stats)?.[1]);
    check(tokens === v.usage.completion_tokens, `stats "${shown.stats}" vs usage ${JSON.stringify(v.usage)}`);
    check(/tok\/s/.test(shown.stats) || tokens < 2, `no speed in the stats line "${shown.stats}"`);
    history.push({ role: "assistant", content: want });
    // Bubbles, then one text update per delta, then the usage line: an answer that arrived
    // in one piece would show up as a handful of mutations only.
    const updates = await page.evaluate(() => window.__updates);
    check(updates >= 3 + tokens / 2, `the answer did not stream in (${updates} DOM updates for ${tokens} tokens)`);
    console.log(`${transport} turn ${turn + 1}: ${tokens} tokens, ${updates} DOM updates, answer ${JSON.stringify(shown.raw)}`);
  }
  if (transport === "http") {
    check(streams.filter((t) => t.startsWith("text/event-stream")).length === 2,
      `the page's requests were not streamed: ${JSON.stringify(streams)}`);
  }

  // The conversation is in IndexedDB: a reload lists it, and opening it shows both turns.
  const saved = await page.evaluate(() => new Promise((resolve, reject) => {
    const open = indexedDB.open("tinyllm-chat");
    open.onerror = () => reject(open.error);
    open.onsuccess = () => {
      const req = open.result.transaction("conversations").objectStore("conversations").getAll();
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    };
  }));
  check(saved.length === 1 && JSON.stringify(saved[0].messages.map((m) => ({ role: m.role, content: m.content }))) === JSON.stringify(history),
    `IndexedDB holds ${JSON.stringify(saved)}, the conversation is ${JSON.stringify(history)}`);
  await page.reload();
  await page.waitForSelector("#conversations li");
  await page.click("#conversations li span");
  const restored = await page.$$eval(".msg", (els) => els.map((e) => e.querySelector(".body")?.dataset.raw ?? e.textContent));
  check(JSON.stringify(restored) === JSON.stringify(history.map((m) => m.content)),
    `the reopened conversation shows ${JSON.stringify(restored)}`);
  if (transport === "worker") {
    // The reload dropped the model; the page's ?model= loads it again.
    await page.waitForFunction(() => document.getElementById("model").textContent.length > 0);
  }
  await page.fill("#temperature", "0");

  // "New chat" empties the log.
  await page.click("#clear");
  check((await page.$$(".msg")).length === 0, "New chat left messages behind");

  // Stop: a long answer is cut short, keeps what came and says so; the next message works.
  // The fixture writes thousands of tokens a second, faster than a click from here: the page
  // presses Stop itself as soon as the first text shows, as a user's click would.
  await page.fill("#max_tokens", "1500");
  await page.evaluate(() => {
    const log = document.getElementById("log");
    const o = new MutationObserver(() => {
      const b = [...log.querySelectorAll(".msg.assistant .body")].at(-1);
      if (b && b.dataset.raw.length > 0) {
        o.disconnect();
        window.__sendLabel = document.getElementById("send").textContent;
        document.getElementById("send").click();
      }
    });
    o.observe(log, { subtree: true, childList: true, characterData: true, attributes: true });
  });
  await send(page, "Count to a thousand, please.");
  await page.waitForFunction(() => window.__sendLabel !== undefined);
  check((await page.evaluate(() => window.__sendLabel)) === "Stop", "the send button does not offer Stop while streaming");
  await idle(page);
  const stopped = await lastAnswer(page);
  check(stopped.stopped && stopped.raw.length > 0, `the stopped answer: ${JSON.stringify(stopped)}`);
  await page.fill("#max_tokens", String(MAX_TOKENS));
  await send(page, "Hello again.");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant .stats").length >= 1);
  await idle(page);
  check((await errorShown(page)) === null, `after the stop: ${await errorShown(page)}`);
  await page.screenshot({ path: `${shotPrefix}-conversation.png` });
  await checkShot(context, `${shotPrefix}-conversation.png`);

  // Reasoning: open while it streams, folded when the answer ends, unfolded by a click.
  await page.click("#clear");
  await page.evaluate(() => {
    window.__opened = 0;
    new MutationObserver((records) => {
      for (const r of records) if (r.attributeName === "open" && r.target.open) window.__opened++;
    }).observe(document.getElementById("log"), { subtree: true, attributes: true, attributeFilter: ["open"] });
  });
  await send(page, THINK);
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant .stats").length === 1);
  await idle(page);
  const thought = await lastAnswer(page);
  check(thought.reasoning.length > 0, `no reasoning shown: ${JSON.stringify(thought)}`);
  check(!thought.open, "the reasoning is not folded after the answer");
  check((await page.evaluate(() => window.__opened)) >= 1, "the reasoning was never shown open while streaming");
  check((await page.isVisible(".msg.assistant details.reasoning > div")) === false, "folded reasoning is visible");
  await page.click(".msg.assistant details.reasoning > summary");
  check(await page.isVisible(".msg.assistant details.reasoning > div"), "a click does not unfold the reasoning");
  await page.screenshot({ path: `${shotPrefix}-reasoning.png` });
  await checkShot(context, `${shotPrefix}-reasoning.png`);

  console.log(`model ${modelId} over ${transport}`);
  check(problems.length === 0, problems.join("\n"));
  console.log("chat page: ok");
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
