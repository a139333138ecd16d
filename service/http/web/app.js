// poissonmark page: check text for a watermark and see the evidence; generate and check.
// It calls only the documented API (/v1/keys, /v1/detect, /v1/generate) and reads the served
// document (/openapi.json) for the server's limits. Text from the user
// or the server is only ever put into the page with textContent (never innerHTML).
"use strict";

const TOKEN_KEY = "poissonmark.token";
const MAX_FILE_BYTES = 2 * 1024 * 1024;
const SKIP_WORDS = {
  no_context: "not scored: too close to the start to have a full context",
  repeated_context: "not scored: its context appeared earlier in the text, so its randomness is not fresh",
  special_token: "not scored: a special token",
};
// The server's evidence bands (detector/bands.py): a block's mean per-token score.
const BAND_WORDS = ["no more than chance", "some", "strong", "very strong"];
const SUPERSCRIPT = {
  "-": "\u207b", 0: "\u2070", 1: "\u00b9", 2: "\u00b2", 3: "\u00b3", 4: "\u2074",
  5: "\u2075", 6: "\u2076", 7: "\u2077", 8: "\u2078", 9: "\u2079",
};
const VERDICT_WORDS = {
  watermarked: "Watermarked",
  not_detected: "No watermark detected",
  insufficient_evidence: "Not enough text to decide",
};

const $ = (id) => document.getElementById(id);
let lastAnswer = null; // {text, token_ids, key_id, prompt} of the last finished generation
let generatedFrom = null; // the prompt of the generation under way
let generation = null; // AbortController of the running generation

// ---- API ------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Authorization: `Bearer ${token()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (!response.ok) {
    let problem = {};
    try {
      problem = await response.json();
    } catch {
      problem = { title: response.statusText };
    }
    throw new ApiError(response.status, problem);
  }
  return response;
}

function say(element, message, isError = false) {
  element.textContent = message;
  element.classList.toggle("error", isError);
}

// ---- token and keys -------------------------------------------------------------------------
// A tenant may hold thousands of keys: the pickers are search boxes whose suggestions come from
// one page of GET /v1/keys (the first keys, or those whose id starts with what was typed).

const SUGGESTIONS = 20;
const searches = {}; // picker id -> timer of its pending search

async function loadKeys() {
  const status = $("auth-status");
  if (!token()) {
    say(status, "Enter an API token to start.");
    return;
  }
  try {
    const page = await keyPage("", false);
    suggest("gen-key", page.keys);
    suggest("check-key", page.keys);
    const n = page.keys.length;
    const count = page.next_cursor ? `at least ${n} active keys` : `${n} active key${n === 1 ? "" : "s"}`;
    const hint = page.next_cursor ? "; type a key id to search them" : "";
    say(status, `Token accepted: ${count} in your tenant${hint}.`);
  } catch (error) {
    suggest("gen-key", []);
    suggest("check-key", []);
    if (error instanceof ApiError && error.status === 403) {
      say(status, "This token cannot list keys; checks run against all keys of your tenant.");
    } else {
      say(status, `Token not accepted: ${error.message}`, true);
    }
  }
}

// What was typed as a key-id prefix for the API ("3f" and "pmk_3f" alike), or null.
function keyPrefix(typed) {
  const q = typed.trim().toLowerCase();
  if (/^pmk_[0-9a-f]{0,16}$/.test(q)) return q;
  if (/^[0-9a-f]{1,16}$/.test(q)) return `pmk_${q}`;
  if ("pmk_".startsWith(q)) return "pmk_";
  return null;
}

async function keyPage(prefix, includeRevoked) {
  const query = new URLSearchParams({ limit: String(SUGGESTIONS) });
  if (prefix) query.set("prefix", prefix);
  if (!includeRevoked) query.set("include_revoked", "false");
  return (await api(`/v1/keys?${query}`)).json();
}

function suggest(pickerId, keys) {
  $(`${pickerId}-options`).replaceChildren(
    ...keys.map((key) => new Option(key.revoked ? "revoked" : "", key.key_id)),
  );
}

// Search the keys as the user types (debounced); the check picker includes revoked keys.
function searchKeys(pickerId) {
  clearTimeout(searches[pickerId]);
  searches[pickerId] = setTimeout(async () => {
    const found = $(`${pickerId}-found`);
    const typed = $(pickerId).value.trim();
    const prefix = typed ? keyPrefix(typed) : "";
    if (prefix === null) {
      suggest(pickerId, []);
      say(found, typed ? "Key ids look like pmk_ and 16 hex digits." : "");
      return;
    }
    try {
      const page = await keyPage(prefix, pickerId === "check-key");
      suggest(pickerId, page.keys);
      const n = page.keys.length;
      say(found, typed ? `${page.next_cursor ? `${n}+` : n} matching key${n === 1 ? "" : "s"}` : "");
    } catch (error) {
      say(found, `Search failed: ${error.message}`, true);
    }
  }, 200);
}

// The keys a check tests: one key id, or none (all keys of the tenant).
function checkKeyId() {
  return $("check-one").checked ? $("check-key").value.trim() : "";
}

async function newKey() {
  const status = $("generate-status");
  try {
    const key = await (await api("/v1/keys", { method: "POST", body: {} })).json();
    await loadKeys();
    $("gen-key").value = key.key_id;
    say(status, `Created key ${key.key_id}.`);
  } catch (error) {
    say(status, `Could not create a key: ${error.message}`, true);
  }
}

// ---- check ----------------------------------------------------------------------------------

function formatP(log10p) {
  if (log10p > -4) return Number(10 ** log10p).toPrecision(3);
  const exponent = Math.floor(log10p);
  const mantissa = 10 ** (log10p - exponent);
  const sup = String(exponent).replace(/[-0-9]/g, (c) => SUPERSCRIPT[c]);
  return `${mantissa.toFixed(2)} × 10${sup}`;
}

function chanceWords(log10p) {
  // How rare evidence this strong is in text without the watermark (p = 10^log10p), as
  // {percent} for p > 1/2 ("about 87 in 100"), {count} for "1 text in N" up to N = 1,000,
  // else {mantissa, exponent}: "1 text in m × 10^k" with 1/p = m × 10^k, m rounded to 1..9.
  const strength = -log10p; // log10 of N in "1 text in N"
  if (strength < Math.log10(2)) return { percent: Math.min(100, Math.round(100 * 10 ** log10p)) };
  if (strength < 3) return { count: Math.round(10 ** strength) };
  let exponent = Math.floor(strength);
  let mantissa = Math.round(10 ** (strength - exponent));
  if (mantissa === 10) {
    mantissa = 1;
    exponent += 1;
  }
  return { mantissa, exponent };
}

function chanceText(log10p) {
  // chanceNode's sentence as plain text (10^k for the power).
  const words = chanceWords(log10p);
  if (words.percent !== undefined) return commonWords(words.percent);
  const n = words.count !== undefined ? String(words.count) : `${times(words)}10^${words.exponent}`;
  return `Evidence this strong occurs by chance in about 1 text in ${n}.`;
}

function commonWords(percent) {
  return percent >= 100
    ? "Any text without the watermark shows evidence at least this strong."
    : `Evidence this strong is common by chance: about ${percent} in 100 texts without the ` +
        "watermark show it.";
}

function times(words) {
  return words.mantissa > 1 ? `${words.mantissa} × ` : "";
}

function chanceNode(log10p) {
  const fragment = document.createDocumentFragment();
  const words = chanceWords(log10p);
  if (words.percent !== undefined) {
    fragment.append(commonWords(words.percent));
    return fragment;
  }
  fragment.append("Evidence this strong occurs by chance in about 1 text in ");
  if (words.count !== undefined) {
    fragment.append(String(words.count));
  } else {
    const power = document.createElement("span");
    power.className = "power";
    const sup = document.createElement("sup");
    sup.textContent = String(words.exponent);
    power.append(`${times(words)}10`, sup);
    power.setAttribute("aria-label", `${times(words)}10 to the power ${words.exponent}`);
    fragment.append(power);
  }
  fragment.append(".");
  return fragment;
}

function addNumber(list, term, value) {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  dd.textContent = value;
  list.append(dt, dd);
}

function renderResult(response) {
  const best = response.results.find((r) => r.key_id === response.best_key_id) || response.results[0];
  $("result").hidden = false;
  const verdict = $("verdict");
  verdict.className = `verdict ${response.verdict}`;
  verdict.textContent = VERDICT_WORDS[response.verdict] || response.verdict;
  verdict.dataset.verdict = response.verdict;

  const words = $("verdict-words");
  words.replaceChildren();
  const power = response.power || best.power;
  if (response.verdict === "insufficient_evidence") {
    words.append(
      `This text is too short to tell: only ${best.num_scored} tokens could be scored, and a ` +
        `typically watermarked text needs at least ${response.min_scored_tokens} to be detected ` +
        `at level ${response.alpha}.`,
    );
    if (power && power.min_detectable_mean_score !== null) {
      words.append(
        ` It would have been detected if its mean per-token score were at least ` +
          `${power.min_detectable_mean_score.toFixed(2)} (human text averages 1, a typically ` +
          `watermarked text ${power.reference_mean_score.toFixed(1)}).`,
      );
    }
  } else {
    words.append(chanceNode(response.log10_p_value));
    words.append(
      response.verdict === "watermarked"
        ? ` That is below the level ${response.alpha}: the text carries the watermark.`
        : ` That is not below the level ${response.alpha}.`,
    );
  }

  // a sign of tampering: what the canonical reading had to undo before the text was scored
  const reading = $("reading");
  const changes = response.reading ? response.reading.changes.summary : [];
  reading.hidden = changes.length === 0;
  reading.replaceChildren();
  if (changes.length) {
    const which =
      response.reading.name === "canonical" ? "its canonical reading" : "the text as pasted";
    const tried =
      response.reading.readings_tried > 1
        ? " Both readings were tested; the p-value is corrected for the " +
          `${response.reading.readings_tried} tried.`
        : "";
    reading.append(
      `This text holds characters a reader does not see or letters from another script: ` +
        `${changes.join("; ")}. The evidence comes from ${which}.${tried}`,
    );
  }

  const numbers = $("numbers");
  numbers.replaceChildren();
  addNumber(numbers, "p-value", formatP(response.log10_p_value));
  addNumber(numbers, "log10 p", response.log10_p_value.toFixed(2));
  if (typeof response.whole_text_log10_p_value === "number") {
    addNumber(numbers, "Whole-text p", formatP(response.whole_text_log10_p_value));
  }
  if (typeof response.span_log10_p_value === "number") {
    addNumber(numbers, "Best-span p", formatP(response.span_log10_p_value));
  }
  addNumber(numbers, "Scored tokens", `${best.num_scored} of ${best.num_tokens}`);
  if (power && power.min_detectable_mean_score !== null) {
    addNumber(
      numbers,
      "Would be detected from",
      `a mean score of ${power.min_detectable_mean_score.toFixed(2)} per token ` +
        `(typical watermark ${power.reference_mean_score.toFixed(1)})`,
    );
  }
  if (best.edit_tolerant) {
    // with several keys, the server's value corrected for them (the best key's own p is selected)
    const realigned =
      best.edit_tolerant.keys_corrected_log10_p_value ?? best.edit_tolerant.log10_p_value;
    addNumber(numbers, "Edit-tolerant test p", formatP(realigned));
  }
  // the model tests: the server's values, corrected for the keys tested
  const given = best.likelihood_ratio?.conditioned_on_prompt ? ", given the prompt" : "";
  if (typeof response.likelihood_ratio_log10_p_value === "number") {
    addNumber(
      numbers,
      `Likelihood-ratio test p${given}`,
      formatP(response.likelihood_ratio_log10_p_value),
    );
  }
  if (typeof response.entropy_weighted_log10_p_value === "number") {
    addNumber(numbers, "Entropy-weighted test p", formatP(response.entropy_weighted_log10_p_value));
  }
  if (typeof response.edit_filtered_log10_p_value === "number") {
    addNumber(numbers, "Edit-filtered test p", formatP(response.edit_filtered_log10_p_value));
  }
  const skipped = Object.entries(best.skipped).filter(([, n]) => n > 0);
  addNumber(
    numbers,
    "Not scored",
    skipped.length ? skipped.map(([why, n]) => `${n} ${why.replace("_", " ")}`).join(", ") : "none",
  );
  addNumber(numbers, "Key", response.best_key_id);
  if (response.num_keys > 1) {
    addNumber(numbers, "Keys tested", `${response.num_keys} (p-value corrected for all of them)`);
  }
  if (best.retokenization_matches === false) {
    addNumber(numbers, "Note", "the text does not re-tokenize to the generated token ids");
  }
  // Outline only the spans significant at alpha after the server's correction for the windows
  // scanned and the keys tested (keys_corrected_log10_p_value), in text order.
  const spans = best.spans
    ? best.spans.spans
        .map((s) => ({
          ...s,
          shown_log10_p: s.keys_corrected_log10_p_value ?? s.corrected_log10_p_value,
        }))
        .filter((s) => s.shown_log10_p <= Math.log10(response.alpha))
        .sort((a, b) => a.token_start - b.token_start)
    : null;
  renderSpansSummary(best.spans, spans, response.alpha, response.num_keys);
  renderEvidence(best.tokens || [], spans || []);
}

function renderSpansSummary(search, spans, alpha, numKeys) {
  const keysNote = numKeys > 1 ? ` and testing ${numKeys} keys` : "";
  const box = $("spans-summary");
  box.replaceChildren();
  if (!search) return;
  const heading = document.createElement("p");
  const count = spans.length;
  heading.textContent =
    count === 0
      ? `No detected span: no window of the ${search.windows_scanned} scanned has a corrected ` +
        `p-value below ${alpha}.`
      : `${count} detected span${count === 1 ? "" : "s"} (corrected p-value below ${alpha} after ` +
        `scanning ${search.windows_scanned} windows${keysNote}):`;
  box.append(heading);
  if (count === 0) return;
  const list = document.createElement("ol");
  list.className = "spans-list";
  spans.forEach((span, i) => {
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = `#span-${i + 1}`;
    link.textContent = `characters ${span.start}–${span.end}`;
    item.append(
      link,
      `: ${span.num_scored} scored tokens, corrected p = ${formatP(span.shown_log10_p)}`,
    );
    list.append(item);
  });
  box.append(list);
}

function tokenElement(token) {
  const element = document.createElement("span");
  element.className = "tok";
  element.textContent = token.text;
  if (token.status === "scored") {
    // The band of the token's block (0-3; every token has it), or with the evidence scope the
    // token's own Aaronson term: Exp(1) without the watermark; it saturates at 5 (p ~ 0.007).
    const raw = token.score !== null && token.score !== undefined;
    const level = raw ? Math.min(token.score / 5, 1) : token.band / 3;
    element.style.setProperty("--level", level.toFixed(3));
    element.dataset.level = level.toFixed(3);
    element.title = raw
      ? `evidence ${token.score.toFixed(2)} (r = ${token.pivot.toFixed(3)})`
      : `${BAND_WORDS[token.band]} evidence in this stretch of text`;
  } else {
    element.classList.add("skipped");
    element.dataset.skip = token.skip_reason;
    element.title = SKIP_WORDS[token.skip_reason] || `not scored: ${token.skip_reason}`;
  }
  return element;
}

function renderEvidence(tokens, spans) {
  // The tokens' pieces partition the text the server scored (its own decoding when token ids
  // were sent), so the view is built from them alone: no offsets to translate.
  const box = $("evidence");
  box.replaceChildren();
  let spanIndex = 0;
  let container = box;
  tokens.forEach((token, i) => {
    const span = spans[spanIndex];
    if (span && i === span.token_start) {
      container = document.createElement("mark");
      container.className = "span";
      container.id = `span-${spanIndex + 1}`;
      container.dataset.start = span.start;
      container.dataset.end = span.end;
      const label = document.createElement("span");
      label.className = "span-label";
      label.textContent = `span ${spanIndex + 1}: p ${formatP(span.shown_log10_p)}`;
      container.append(label);
      box.append(container);
    }
    if (token.text) container.append(tokenElement(token));
    if (span && i === span.token_end - 1) {
      container = box;
      spanIndex += 1;
    }
  });
}

async function check(event, tokenIds) {
  if (event) event.preventDefault();
  const status = $("check-status");
  const text = $("check-text").value;
  if (!text.trim()) {
    say(status, "Paste some text first.", true);
    return;
  }
  const body = {
    text,
    alpha: Number($("check-alpha").value),
    evidence: true,
    spans: true,
  };
  if ($("check-one").checked && !checkKeyId()) {
    say(status, "Type the key id to test, or choose all keys of your tenant.", true);
    return;
  }
  if (checkKeyId()) body.key_id = checkKeyId();
  if (tokenIds) body.token_ids = tokenIds;
  if ($("check-realign").checked) body.realign = true;
  const lr = $("check-lr").checked;
  const entropy = $("check-entropy").checked;
  const editFilter = $("check-edit-filter").checked;
  if (lr || entropy || editFilter) {
    // the model tests read the target's law under the generation's processing (and prompt)
    if (lr) body.likelihood_ratio = true;
    if (entropy) body.entropy_weighting = true;
    if (editFilter) body.edit_filter = true;
    // a field left empty is left out: the server's default applies (1, 50, 1), never 0
    body.processing = {};
    for (const [id, name] of [
      ["check-temperature", "temperature"],
      ["check-top-k", "top_k"],
      ["check-top-p", "top_p"],
    ]) {
      const value = $(id).value.trim();
      if (value !== "") body.processing[name] = Number(value);
    }
    const prompt = $("check-prompt").value;
    if (prompt.trim()) body.prompt = prompt;
  }
  $("check-button").disabled = true;
  say(status, "Checking…");
  try {
    const response = await (await api("/v1/detect", { method: "POST", body })).json();
    renderResult(response);
    say(status, "");
  } catch (error) {
    $("result").hidden = true;
    say(status, `Check failed: ${error.message}`, true);
  } finally {
    $("check-button").disabled = false;
  }
}

async function readFile() {
  const file = $("check-file").files[0];
  if (!file) return;
  if (file.size > MAX_FILE_BYTES) {
    say($("check-status"), `That file is over ${MAX_FILE_BYTES / 1024 / 1024} MB.`, true);
    return;
  }
  $("check-text").value = await file.text();
  say($("check-status"), `Loaded ${file.name}.`);
}

// ---- generate -------------------------------------------------------------------------------

function* serverSentEvents(buffer) {
  // Complete events in `buffer.text`; what is left is kept there for the next chunk.
  let end;
  while ((end = buffer.text.indexOf("\n\n")) >= 0) {
    const block = buffer.text.slice(0, end);
    buffer.text = buffer.text.slice(end + 2);
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
    }
    yield { name, data: data.length ? JSON.parse(data.join("\n")) : null };
  }
}

async function generate(event) {
  event.preventDefault();
  const status = $("generate-status");
  const answer = $("answer");
  const keyId = $("gen-key").value.trim();
  if (!keyId) {
    say(status, "Choose a key (or create one) first.", true);
    return;
  }
  const body = {
    key_id: keyId,
    prompt: $("gen-prompt").value,
    method: $("gen-method").value,
    drafts: Number($("gen-drafts").value),
    lookahead: Number($("gen-lookahead").value),
    max_new_tokens: Number($("gen-max").value),
    stream: true,
  };
  answer.textContent = "";
  $("gen-stats").textContent = "";
  $("check-answer").hidden = true;
  lastAnswer = null;
  generatedFrom = body.prompt;
  generation = new AbortController();
  $("generate-button").disabled = true;
  $("stop-button").disabled = false;
  say(status, "Generating…");
  try {
    const response = await api("/v1/generate", { method: "POST", body, signal: generation.signal });
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const buffer = { text: "" };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer.text += value;
      for (const message of serverSentEvents(buffer)) {
        if (message.name === "delta") {
          answer.append(message.data.text);
        } else if (message.name === "done") {
          finishGeneration(message.data);
        } else if (message.name === "error") {
          throw new ApiError(500, message.data);
        }
      }
    }
    if (!lastAnswer) throw new Error("the stream ended before the answer was complete");
  } catch (error) {
    if (error.name === "AbortError") say(status, "Stopped.");
    else say(status, `Generation failed: ${error.message}`, true);
  } finally {
    generation = null;
    $("generate-button").disabled = false;
    $("stop-button").disabled = true;
  }
}

function finishGeneration(done) {
  lastAnswer = {
    text: done.text,
    token_ids: done.token_ids,
    key_id: done.key_id,
    prompt: generatedFrom,
  };
  $("answer").textContent = done.text;
  const s = done.stats;
  $("gen-stats").textContent =
    `${s.emitted_tokens} tokens in ${s.seconds.toFixed(2)} s (${s.tokens_per_second.toFixed(1)} ` +
    `tokens/s), ${s.target_forward_passes} model passes (${s.aatps.toFixed(2)} tokens per ` +
    `pass: more than 1 when the drafter's guesses were right); ` +
    `finish: ${done.finish_reason}; watermark ${done.watermark_applied ? "applied" : "not applied"}.`;
  say($("generate-status"), "Done.");
  $("check-answer").hidden = false;
}

function checkAnswer() {
  if (!lastAnswer) return;
  $("check-text").value = lastAnswer.text;
  $("check-key").value = lastAnswer.key_id;
  // what the model tests read the law after: the generation's prompt and processing (the page
  // generates at the server's defaults)
  $("check-prompt").value = lastAnswer.prompt;
  $("check-temperature").value = "1";
  $("check-top-k").value = "50";
  $("check-top-p").value = "1";
  $("check-one").checked = true;
  selectTab($("tab-check"));
  check(null, lastAnswer.token_ids);
}

async function loadLimits() {
  // The generate form's bounds and defaults are the server's: its served OpenAPI document
  // states its limits (B, L, max new tokens), so the page keeps no copy of them.
  try {
    const schema = (await (await fetch("/openapi.json")).json()).components.schemas;
    const fields = schema.GenerateRequest.properties;
    for (const [id, name] of [
      ["gen-drafts", "drafts"],
      ["gen-lookahead", "lookahead"],
      ["gen-max", "max_new_tokens"],
    ]) {
      const field = fields[name];
      if (field.minimum !== undefined) $(id).min = String(field.minimum);
      if (field.maximum !== undefined) $(id).max = String(field.maximum);
      if (field.default !== undefined) $(id).value = String(field.default);
    }
    $("generate-form").dataset.limits = "server";
  } catch {
    // Without the document the form has no upper bounds; the server still checks them.
  }
}

// ---- tabs -----------------------------------------------------------------------------------

function selectTab(tab) {
  for (const other of document.querySelectorAll('[role="tab"]')) {
    const selected = other === tab;
    other.setAttribute("aria-selected", String(selected));
    other.tabIndex = selected ? 0 : -1;
    $(other.getAttribute("aria-controls")).hidden = !selected;
  }
  tab.focus();
}

function tabKeys(event) {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  const i = tabs.indexOf(event.target);
  if (event.key === "ArrowRight") selectTab(tabs[(i + 1) % tabs.length]);
  else if (event.key === "ArrowLeft") selectTab(tabs[(i - 1 + tabs.length) % tabs.length]);
}

// ---- wiring ---------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    say($("auth-status"), "Checking the token…");
    loadKeys();
  });
  $("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    suggest("gen-key", []);
    suggest("check-key", []);
    say($("auth-status"), "Token forgotten.");
  });
  for (const tab of document.querySelectorAll('[role="tab"]')) {
    tab.addEventListener("click", () => selectTab(tab));
    tab.addEventListener("keydown", tabKeys);
  }
  $("check-form").addEventListener("submit", (event) => check(event));
  $("check-file").addEventListener("change", readFile);
  $("generate-form").addEventListener("submit", generate);
  $("stop-button").addEventListener("click", () => generation && generation.abort());
  $("new-key").addEventListener("click", newKey);
  for (const id of ["check-key", "gen-key"]) {
    $(id).addEventListener("input", () => searchKeys(id));
  }
  $("check-key").addEventListener("input", () => {
    $("check-one").checked = $("check-key").value !== "" || $("check-one").checked;
  });
  $("check-all").addEventListener("change", () => {
    $("check-key").value = "";
    searchKeys("check-key"); // back to the first page of suggestions
  });
  $("check-answer").addEventListener("click", checkAnswer);
  loadLimits();
  loadKeys();
});
