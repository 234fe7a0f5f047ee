// The System One page: a document read once, questions accumulating below it (each one
// `choice` on POST /v1/systemone with the document as the state), and a chat panel on
// POST /v1/chat/completions. Plain JS, no build step; every run is an independent fetch,
// so questions keep scoring while the user types, chats or loads another document.
"use strict";

const ENDPOINT_DECIDE = "v1/systemone";
const ENDPOINT_CHAT = "v1/chat/completions";
const KEY_STORAGE = "serveproto.apiKey";
const MAX_FILE_BYTES = 4 << 20; // 4 MiB of text is far past any context window
const CHAT_MAX_TOKENS = 256; // one chat reply's limit, as the terminal client's default
// Normalised-entropy readings, as serveproto chat gives them: < 0.4 sure, 0.4..0.8 unsure, > 0.8 does not know.
const SURE_BELOW = 0.4, UNSURE_UP_TO = 0.8;
const REFUSED_EXT = {
  pdf: "PDF", doc: "Word", docx: "Word", odt: "OpenDocument", rtf: "RTF", pages: "Pages",
  xls: "Excel", xlsx: "Excel", ods: "OpenDocument", ppt: "PowerPoint", pptx: "PowerPoint", epub: "EPUB",
};

const $ = (sel, root = document) => root.querySelector(sel);

// ---- pure helpers --------------------------------------------------------------------

/** Split "a | b | c" into labels; throws an Error naming the problem. */
function parseOptions(text) {
  const parts = text.split("|").map((s) => s.trim());
  if (parts.length > 1 && parts.some((s) => !s)) throw new Error("options: an empty option between '|' separators");
  const labels = parts.filter(Boolean);
  if (labels.length < 2) throw new Error("options: give at least two, separated by '|' (e.g. yes | no)");
  const seen = new Set();
  for (const l of labels) {
    if (seen.has(l)) throw new Error(`options: "${l}" is given twice`);
    seen.add(l);
  }
  return labels;
}

/** Shannon entropy of probabilities (shape (n,)) divided by ln(n): 0 sure .. 1 flat. */
function normalisedEntropy(ps) {
  const n = ps.length;
  if (n < 2) return 0;
  const total = ps.reduce((a, b) => a + b, 0);
  let h = 0;
  for (const p of ps) if (p > 0) h -= (p / total) * Math.log(p / total);
  return Math.min(1, Math.max(0, h / Math.log(n)));
}

function entropyReading(h) {
  if (h < SURE_BELOW) return "sure";
  if (h <= UNSURE_UP_TO) return "unsure";
  return "does not know";
}

/** One line out of an error body: Jev `detail` (list or object), OpenAI `error`, or the text. */
function errorMessage(status, text) {
  let body;
  try { body = JSON.parse(text); } catch { return `HTTP ${status}: ${text.trim().slice(0, 200) || "error"}`; }
  let msg = null;
  if (body && Array.isArray(body.detail) && body.detail.length) {
    msg = body.detail.slice(0, 3).map((d) => {
      const loc = (d.loc || []).join(".");
      return loc ? `${loc}: ${d.msg}` : String(d.msg);
    }).join("; ");
  } else if (body && body.detail && typeof body.detail === "object" && body.detail.message) {
    msg = body.detail.message;
  } else if (body && typeof body.detail === "string") {
    msg = body.detail;
  } else if (body && body.error) {
    msg = typeof body.error === "string" ? body.error : body.error.message;
  }
  msg = msg || text.trim().slice(0, 200);
  if (status === 401) msg += " (set the API key at the top right)";
  return `HTTP ${status}: ${msg}`;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("#api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// A busy server (429, or 503 while its engine restarts) says when to come back with
// Retry-After: wait that long (10 s at most) and try again, twice at most, as the Jev SDK does.
const RETRY_STATUSES = [429, 503], MAX_RETRIES = 2, MAX_RETRY_AFTER_S = 10;

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(t); reject(new DOMException("aborted", "AbortError")); });
  });
}

/** POST JSON; resolves to the 2xx Response, rejects with an Error carrying one readable line.
 *  onRetry(seconds) is called before waiting out a busy server's Retry-After. */
async function post(path, body, signal, onRetry) {
  for (let attempt = 0; ; attempt++) {
    let resp;
    try {
      resp = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body), signal });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new Error("the server did not answer (is `serveproto serve` running?)");
    }
    if (resp.ok) return resp;
    const text = await resp.text();
    const after = Number(resp.headers.get("Retry-After"));
    const retry = RETRY_STATUSES.includes(resp.status) && resp.headers.has("Retry-After")
      && Number.isFinite(after) && after >= 0 && after <= MAX_RETRY_AFTER_S && attempt < MAX_RETRIES;
    if (!retry) throw new Error(errorMessage(resp.status, text));
    if (onRetry) onRetry(after);
    await sleep(after * 1000, signal);
  }
}

// ---- the document --------------------------------------------------------------------

const doc = {
  el: null,
  setError(msg) {
    const e = $("#doc-error");
    e.textContent = msg || "";
    e.hidden = !msg;
  },
  info() {
    const n = this.el.value.length;
    $("#doc-info").textContent = n ? `${n.toLocaleString("en")} characters${this.fileName ? " · " + this.fileName : ""}` : "";
    questions.markStale();
  },
  fileName: "",
  /** Read a File as UTF-8 text into the document, or refuse it with a message. */
  async load(file) {
    const ext = (file.name.split(".").pop() || "").toLowerCase();
    if (REFUSED_EXT[ext]) {
      this.setError(`${file.name}: ${REFUSED_EXT[ext]} files are not supported; paste the text or save it as plain text (.txt, .md).`);
      return false;
    }
    if (file.size > MAX_FILE_BYTES) {
      this.setError(`${file.name}: ${(file.size / 1048576).toFixed(1)} MiB is too large for a document (4 MiB at most).`);
      return false;
    }
    const bytes = new Uint8Array(await file.arrayBuffer());
    const head = String.fromCharCode(...bytes.slice(0, 8));
    if (head.startsWith("%PDF")) { this.setError(`${file.name}: this is a PDF; PDF files are not supported.`); return false; }
    if (head.startsWith("PK\x03\x04") || head.startsWith("\xD0\xCF\x11\xE0")) {
      this.setError(`${file.name}: this is an office document (Word or similar), not plain text; it is not supported.`);
      return false;
    }
    let text;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    } catch {
      this.setError(`${file.name}: not UTF-8 text; only plain-text files can be loaded.`);
      return false;
    }
    if (text.slice(0, 4096).includes("\u0000")) {
      this.setError(`${file.name}: binary content; only plain-text files can be loaded.`);
      return false;
    }
    this.el.value = text.replace(/^\uFEFF/, "");
    this.fileName = file.name;
    this.setError("");
    this.info();
    return true;
  },
  init() {
    this.el = $("#doc");
    this.el.addEventListener("input", () => { this.fileName = ""; this.info(); });
    $("#doc-file").addEventListener("change", async (ev) => {
      const f = ev.target.files[0];
      if (f) await this.load(f);
      ev.target.value = "";
    });
    $("#doc-clear").addEventListener("click", () => { this.el.value = ""; this.fileName = ""; this.setError(""); this.info(); });
    this.el.addEventListener("dragover", (ev) => { ev.preventDefault(); this.el.classList.add("dragging"); });
    this.el.addEventListener("dragleave", () => this.el.classList.remove("dragging"));
    this.el.addEventListener("drop", async (ev) => {
      this.el.classList.remove("dragging");
      if (ev.dataTransfer.files.length) {
        ev.preventDefault();
        await this.load(ev.dataTransfer.files[0]);
      }
    });
  },
};

// ---- the questions -------------------------------------------------------------------

const questions = {
  list: [],
  nextId: 1,
  count() {
    const n = this.list.length;
    $("#q-count").textContent = n ? `(${n})` : "";
    $("#ask-all").disabled = n === 0;
  },
  markStale() {
    for (const q of this.list) q.el.classList.toggle("stale", q.state !== null && q.state !== doc.el.value);
  },
  add(text, options) {
    const el = $("#question-template").content.firstElementChild.cloneNode(true);
    const q = { id: this.nextId++, text, options, el, state: null, run: 0, controller: null };
    el.dataset.qid = String(q.id);
    $(".q-text", el).textContent = text;
    $(".q-again", el).addEventListener("click", () => this.ask(q));
    $(".q-remove", el).addEventListener("click", () => this.remove(q));
    const bars = $(".bars", el);
    for (const label of options) {
      const row = [document.createElement("span"), document.createElement("span"), document.createElement("span")];
      row[0].className = "bar-label"; row[0].textContent = label;
      row[1].className = "bar-track"; row[1].innerHTML = '<span class="bar-fill" style="display:block"></span>';
      row[2].className = "bar-pct"; row[2].textContent = "";
      for (const cell of row) { cell.classList.add("bar-row"); cell.dataset.label = label; bars.appendChild(cell); }
    }
    this.list.push(q);
    $("#questions").appendChild(el);
    this.count();
    this.ask(q);
    return q;
  },
  remove(q) {
    if (q.controller) q.controller.abort();
    this.list = this.list.filter((x) => x !== q);
    q.el.remove();
    this.count();
  },
  /** Ask q on the current document; a newer run of the same question wins over an older one. */
  async ask(q) {
    if (q.controller) q.controller.abort();
    const run = ++q.run;
    const controller = new AbortController();
    q.controller = controller;
    const state = doc.el.value;
    const el = q.el;
    el.classList.add("running");
    el.classList.remove("failed", "stale");
    $(".q-status", el).textContent = "scoring…";
    $(".q-error", el).hidden = true;
    const criteria = {};
    for (const label of q.options) criteria[label] = null;
    const body = { state, questions: { q: { type: "choice", instructions: q.text, criteria } } };
    const t0 = performance.now();
    try {
      const resp = await post(ENDPOINT_DECIDE, body, controller.signal, (after) => {
        $(".q-status", el).textContent = `server busy, retrying in ${after} s…`;
      });
      const reply = await resp.json();
      if (run !== q.run) return;
      const seconds = (performance.now() - t0) / 1000;
      q.state = state;
      this.show(q, reply, seconds);
      $(".q-status", el).textContent = "";
    } catch (e) {
      if (run !== q.run || e.name === "AbortError") return;
      el.classList.add("failed");
      $(".q-status", el).textContent = "failed";
      const err = $(".q-error", el);
      err.textContent = e.message;
      err.hidden = false;
    } finally {
      if (run === q.run) { el.classList.remove("running"); q.controller = null; this.markStale(); }
    }
  },
  show(q, reply, seconds) {
    const answer = reply && reply.answers && reply.answers.q;
    if (!answer || !answer.probabilities) throw new Error("the reply has no answer for this question");
    const ps = q.options.map((l) => Number(answer.probabilities[l] ?? 0));
    const winner = answer.choice;
    const h = normalisedEntropy(ps);
    const reading = entropyReading(h);
    q.el.dataset.entropy = h.toFixed(6);
    q.el.dataset.winner = winner;
    for (const cell of q.el.querySelectorAll(".bar-row")) {
      const i = q.options.indexOf(cell.dataset.label);
      const p = ps[i];
      cell.dataset.p = String(p);
      cell.classList.toggle("win", cell.dataset.label === winner);
      if (cell.classList.contains("bar-track")) $(".bar-fill", cell).style.width = `${(100 * p).toFixed(2)}%`;
      if (cell.classList.contains("bar-pct")) cell.textContent = `${(100 * p).toFixed(1)}%`;
    }
    const w = $(".winner", q.el);
    w.innerHTML = "";
    const arrow = document.createTextNode("→ ");
    const label = Object.assign(document.createElement("span"), { className: "label", textContent: winner });
    const ent = Object.assign(document.createElement("span"), { className: "entropy", textContent: `  entropy ${h.toFixed(3)} ` });
    const rd = Object.assign(document.createElement("span"), {
      className: "reading " + (reading === "does not know" ? "unknown" : reading), textContent: reading,
    });
    w.append(arrow, label, ent, rd);
    const u = reply.usage || {};
    $(".meta", q.el).textContent =
      `${seconds.toFixed(2)} s · ${u.input_tokens ?? "?"} prompt tokens · ${u.output_tokens ?? "?"} option tokens read`;
  },
  init() {
    $("#ask-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const text = $("#q-text").value.trim();
      const err = $("#ask-error");
      let options;
      try {
        if (!text) throw new Error("question: type the question first");
        options = parseOptions($("#q-options").value);
      } catch (e) {
        err.textContent = e.message;
        err.hidden = false;
        return;
      }
      err.hidden = true;
      this.add(text, options);
      $("#q-text").value = "";
      $("#q-options").value = "";
      $("#q-text").focus();
    });
    $("#ask-all").addEventListener("click", () => { for (const q of this.list) this.ask(q); });
    this.count();
  },
};

// ---- the chat panel ------------------------------------------------------------------

const chat = {
  messages: [],
  controller: null,
  bubble(role, text) {
    const li = document.createElement("li");
    li.className = `msg ${role}`;
    li.textContent = text;
    $("#chat-log").appendChild(li);
    li.scrollIntoView({ block: "end" });
    return li;
  },
  async send(text) {
    const turn = { role: "user", content: text };
    this.bubble("user", text);
    const out = this.bubble("assistant streaming", "");
    const sys = $("#chat-doc").checked && doc.el.value.trim()
      ? [{ role: "system", content: "The user is looking at this document:\n\n" + doc.el.value }] : [];
    const controller = new AbortController();
    this.controller = controller;
    $("#chat-stop").hidden = false;
    $("#chat-send").disabled = true;
    let reply = "";
    try {
      const resp = await post(ENDPOINT_CHAT, { messages: [...sys, ...this.messages, turn], stream: true, max_tokens: CHAT_MAX_TOKENS }, controller.signal);
      if (!(resp.headers.get("Content-Type") || "").includes("text/event-stream")) {
        const body = await resp.json();
        reply = body.choices[0].message.content;
        out.textContent = reply;
      } else {
        const reader = resp.body.getReader();
        const dec = new TextDecoder();
        let buf = "", done = false;
        while (!done) {
          const { value, done: end } = await reader.read();
          if (end) break;
          buf += dec.decode(value, { stream: true });
          let nl;
          while ((nl = buf.indexOf("\n")) >= 0) {
            const line = buf.slice(0, nl).trim();
            buf = buf.slice(nl + 1);
            if (!line.startsWith("data:")) continue;
            const data = line.slice(5).trim();
            if (data === "[DONE]") { done = true; break; }
            const ev = JSON.parse(data);
            if (ev.error) throw new Error(ev.error.message || String(ev.error));
            for (const c of ev.choices || []) {
              const d = c.delta && c.delta.content;
              if (d) { reply += d; out.textContent = reply; }
            }
          }
        }
        if (!done) throw new Error("the stream ended early");
      }
      this.messages.push(turn, { role: "assistant", content: reply });
    } catch (e) {
      out.classList.add("error");
      out.textContent = reply + (reply ? "\n" : "") + (e.name === "AbortError" ? "stopped; this turn is not kept" : e.message);
    } finally {
      out.classList.remove("streaming");
      $("#chat-stop").hidden = true;
      $("#chat-send").disabled = false;
      this.controller = null;
      out.scrollIntoView({ block: "end" });
    }
  },
  init() {
    const input = $("#chat-input");
    $("#chat-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const text = input.value.trim();
      if (!text || this.controller) return;
      input.value = "";
      this.send(text);
    });
    input.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("#chat-form").requestSubmit(); }
    });
    $("#chat-stop").addEventListener("click", () => this.controller && this.controller.abort());
    $("#chat-clear").addEventListener("click", () => {
      if (this.controller) this.controller.abort();
      this.messages = [];
      $("#chat-log").innerHTML = "";
    });
  },
};

// ---- start ---------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  const key = $("#api-key");
  key.value = localStorage.getItem(KEY_STORAGE) || "";
  key.addEventListener("change", () => localStorage.setItem(KEY_STORAGE, key.value.trim()));
  doc.init();
  questions.init();
  chat.init();
});
