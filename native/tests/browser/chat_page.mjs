// Drives the chat page of a running `tinyllm-native serve` in headless Chromium:
//   node chat_page.mjs http://127.0.0.1:PORT/ [SCREENSHOT.png]
// Sends two messages through the page (greedy, short), waits for each streamed answer to
// finish, and checks it equals what the non-streaming API answers for the same conversation;
// then screenshots the page and checks the image is a real, non-blank PNG. Exits non-zero
// with a reason on any failure. Run by ../browser.rs.
import { chromium } from "playwright-core";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const url = process.argv[2];
if (!url) throw new Error("usage: node chat_page.mjs URL [SCREENSHOT.png]");
const profile = mkdtempSync(join(tmpdir(), "tinyllm-chromium-"));
const shot = process.argv[3] || join(profile, "chat.png");
const MAX_TOKENS = 16;
const VIEWPORT = { width: 1000, height: 700 };

function check(cond, msg) {
  if (!cond) throw new Error(msg);
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
  await page.fill("#input", "This one fails.");
  await page.press("#input", "Enter");
  await page.waitForSelector(".msg.error");
  await page.waitForFunction(() => document.getElementById("send").textContent === "Send");
  const shown = await page.textContent(".msg.error");
  check(shown === message, `error bubble shows ${JSON.stringify(shown)}`);
  const after = await page.$$eval(".msg.assistant", (els) => els.length);
  check(after === before, `a failed request left ${after - before} empty answer bubble(s)`);
  await page.unroute("**/v1/chat/completions");
  refusing = false;
}

// Flags from DESIGN.md (headless, no sandbox, nothing reaching out of the machine); the
// persistent context is what gives Chromium our fresh, empty --user-data-dir.
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: VIEWPORT,
  timeout: 60_000,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu-sandbox", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
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
  // The header shows the model id from /v1/models.
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0);
  const modelId = await page.textContent("#model");

  // Greedy and short, so the API gives the same answer.
  await page.fill("#temperature", "0");
  await page.fill("#max_tokens", String(MAX_TOKENS));

  const history = [];
  for (const [turn, text] of ["Hello there, who are you?", "Tell me more."].entries()) {
    if (turn === 1) await failedTurn(page);
    // Count how often the answer's text changes while it streams in.
    await page.evaluate(() => {
      window.__updates = 0;
      if (window.__observer) window.__observer.disconnect();
      window.__observer = new MutationObserver((records) => { window.__updates += records.length; });
      window.__observer.observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
    });
    await page.fill("#input", text);
    await page.press("#input", "Enter");
    // Finished: the usage line is the last chunk before [DONE]; the button reads Send again.
    await page.waitForFunction(
      ([n, errors]) =>
        document.querySelectorAll(".msg.assistant .stats").length === n ||
        document.querySelectorAll(".msg.error").length > errors,
      [turn + 1, turn],
    );
    await page.waitForFunction(() => document.getElementById("send").textContent === "Send");
    const errors = await page.$$eval(".msg.error", (els) => els.map((e) => e.textContent));
    check(errors.length === turn, `the page shows an error: ${errors.at(-1)}`);

    const bubbles = await page.$$eval(".msg:not(.error)", (els) => els.map((e) => [e.className, e.textContent]));
    const answers = bubbles.filter(([c]) => c === "msg assistant").length;
    const [me, it] = bubbles.slice(-2);
    check(answers === turn + 1 && me[0] === "msg user" && me[1] === text && it[0] === "msg assistant",
      `bubbles after turn ${turn + 1}: ${JSON.stringify(bubbles)}`);
    const shown = await page.$$eval(".msg.assistant", (els) => els.at(-1).querySelector(":scope > span").textContent);
    const stats = await page.$$eval(".msg.assistant .stats", (els) => els.at(-1).textContent);
    check(shown.trim().length > 0, "the streamed answer is empty");

    history.push({ role: "user", content: text });
    const request = sent.at(-1);
    check(JSON.stringify(request.messages) === JSON.stringify(history),
      `the page sent ${JSON.stringify(request.messages)}, the conversation is ${JSON.stringify(history)}`);
    check(request.stream === true && request.temperature === 0 && request.max_tokens === MAX_TOKENS,
      `the page's settings were not sent: ${JSON.stringify(request)}`);
    const api = await fetch(new URL("/v1/chat/completions", url), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages: history, temperature: 0, max_tokens: MAX_TOKENS }),
    });
    const raw = await api.text();
    check(api.ok, `API: ${api.status} ${raw}`);
    const v = JSON.parse(raw);
    const want = v.choices[0].message.content;
    check(shown === want, `page shows ${JSON.stringify(shown)}, the API answers ${JSON.stringify(want)}`);
    const tokens = Number(/(\d+) generated/.exec(stats)?.[1]);
    check(tokens === v.usage.completion_tokens, `stats "${stats}" vs API usage ${JSON.stringify(v.usage)}`);
    history.push({ role: "assistant", content: want });
    // Bubbles, then one text update per delta, then the usage line: an answer that arrived
    // in one piece would show up as a handful of mutations only.
    const updates = await page.evaluate(() => window.__updates);
    check(updates >= 3 + tokens / 2, `the answer did not stream in (${updates} DOM updates for ${tokens} tokens)`);
    console.log(`turn ${turn + 1}: ${tokens} tokens, ${updates} DOM updates, answer ${JSON.stringify(shown)}`);
  }
  check(streams.filter((t) => t.startsWith("text/event-stream")).length === 2,
    `the page's requests were not streamed: ${JSON.stringify(streams)}`);

  // "New chat" empties the log.
  await page.click("#clear");
  check((await page.$$(".msg")).length === 0, "New chat left messages behind");

  // Screenshot of a conversation: send one more and capture it.
  await page.fill("#input", "One more question.");
  await page.press("#input", "Enter");
  await page.waitForSelector(".msg.assistant .stats");
  await page.waitForFunction(() => document.getElementById("send").textContent === "Send");
  await page.screenshot({ path: shot });
  const png = readFileSync(shot);
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
  check(pixels.variance > 50 && pixels.colors > 20, `the screenshot looks blank: ${JSON.stringify(pixels)}`);
  console.log(`model ${modelId}; screenshot ${shot}: ${w}x${h}, ${png.length} bytes, ` +
    `luma mean ${pixels.mean.toFixed(1)} variance ${pixels.variance.toFixed(1)}, ${pixels.colors} colors`);
  check(problems.length === 0, problems.join("\n"));
  console.log("chat page: ok");
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
