// Stop and Force stop of a kernelext panel (and an approval's or a question's card), sent
// to the notebook server, not the kernel.
//
// A click on an ipywidgets button waits in the kernel's queue behind every queued cell
// (Run All) and behind the user's long cell. These buttons POST to kernelext's Jupyter
// Server extension (kernelext/api/<action>), which records the request in the store at
// once. Without that route (an older server, the extension disabled) the click goes to
// the kernel as a widget message; if the kernel does not answer within a second the
// button says so and what to do instead, never nothing.

const ACK_MS = 1200; // how long the kernel route may take to answer a click
const SERVER_MS = 12000; // the server answers within 10 s, recorded or not

function pageConfig() {
  const el = document.getElementById("jupyter-config-data");
  if (!el) return {};
  try {
    return JSON.parse(el.textContent || "{}");
  } catch (_err) {
    return {};
  }
}

function baseUrl(config) {
  let base = config.baseUrl || "/";
  if (!base.endsWith("/")) base += "/";
  return base;
}

function xsrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
  return match ? decodeURIComponent(match[1]) : "";
}

// A time in the reader's zone, with the zone named: "03:01:05 CET".
function clock(date) {
  return date.toLocaleTimeString([], {
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    timeZoneName: "short",
  });
}

function makeButton(label, icon, style) {
  const button = document.createElement("button");
  button.className = `jupyter-widgets jupyter-button widget-button mod-${style}`;
  button.style.width = "auto";
  const glyph = document.createElement("i");
  glyph.className = `fa fa-${icon}`;
  button.appendChild(glyph);
  button.appendChild(document.createTextNode(label));
  return button;
}

async function sendToServer(action, model, extra = {}) {
  const config = pageConfig();
  const headers = { "Content-Type": "application/json", "X-XSRFToken": xsrfToken() };
  if (config.token) headers.Authorization = `token ${config.token}`;
  const body = {
    run_id: model.get("run_id"),
    store: model.get("store"),
    source: model.get("source") || "panel",
    ...extra,
  };
  if (model.get("epoch") >= 0) body.epoch = model.get("epoch");
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), SERVER_MS);
  try {
    const response = await fetch(`${baseUrl(config)}kernelext/api/${action}`, {
      method: "POST",
      credentials: "same-origin",
      headers,
      body: JSON.stringify(body),
      signal: abort.signal,
    });
    let answer = {};
    try {
      answer = await response.json();
    } catch (_err) {
      answer = {};
    }
    // Only kernelext's route names itself: any other answer means it is not there.
    return { status: response.status, body: answer, ours: answer.route === "kernelext" };
  } finally {
    clearTimeout(timer);
  }
}

function sendToKernel(action, model, extra = {}) {
  // The kernel answers by raising ack_seq (it handles the click on its main thread).
  return new Promise((resolve) => {
    const before = model.get("ack_seq");
    let done = false;
    const finish = (answered) => {
      if (done) return;
      done = true;
      model.off("change:ack_seq", onAck);
      resolve(answered);
    };
    const onAck = () => {
      if (model.get("ack_seq") !== before) finish(true);
    };
    model.on("change:ack_seq", onAck);
    model.send({ action, ...extra });
    setTimeout(() => finish(false), ACK_MS);
  });
}

// An approval card's note, Approve and Reject: the decision is recorded through the
// server at once; then the kernel is asked to resume the run (it does when it is free).
function renderApproval(model, el) {
  el.classList.add("kernelext-decision-buttons");
  const noteBox = document.createElement("div");
  noteBox.className = "kernelext-approval-note";
  const input = document.createElement("input");
  input.type = "text";
  input.placeholder = "note for the record (optional)";
  input.className = "widget-input";
  input.style.width = "22em";
  input.value = model.get("note") || ""; // what was typed survives a redraw of the card
  input.addEventListener("input", () => model.set("note", input.value));
  noteBox.appendChild(input);
  const row = document.createElement("div");
  row.style.display = "flex";
  row.style.gap = "2px";
  const approve = makeButton("Approve", "check", "success");
  approve.classList.add("kernelext-approve");
  approve.title = "Allow this one call, with these arguments, once; the run goes on";
  const reject = makeButton("Reject", "times", "danger");
  reject.classList.add("kernelext-reject");
  reject.title = "Refuse it: the agent gets kx.EffectRejected at this call";
  const note = document.createElement("div");
  note.className = "kernelext-click-note";
  row.append(approve, reject);
  el.append(noteBox, row, note);
  const draw = () => {
    const decided = model.get("decided");
    approve.disabled = reject.disabled = input.disabled = decided;
  };
  const decide = async (action) => {
    const label = action === "approve" ? "Approve" : "Reject";
    approve.disabled = reject.disabled = true;
    note.textContent = `${label}: sending…`;
    const extra = { request: model.get("request"), note: input.value };
    let answer = null;
    try {
      answer = await sendToServer(action, model, extra);
    } catch (_err) {
      answer = null;
    }
    if (answer && answer.ours && answer.status === 200) {
      note.textContent = `${answer.body.message} (${clock(new Date())})`;
      model.send({ action: "resume" }); // the kernel resumes the run when it is free
      return;
    }
    if (answer && answer.ours && answer.status < 500) {
      note.textContent = `${label} refused: ${answer.body.message || `HTTP ${answer.status}`}`;
      draw();
      return;
    }
    const answered = await sendToKernel(action, model, { note: input.value });
    if (!answered) note.textContent = model.get("busy_hint");
    draw();
  };
  approve.addEventListener("click", () => decide("approve"));
  reject.addEventListener("click", () => decide("reject"));
  model.on("change:decided", draw);
  model.on("change:kernel_note", () => {
    note.textContent = model.get("kernel_note");
  });
  draw();
}

// A question's answer box, note and Answer: the answer is stored through the server at
// once, as typed (read as the question's schema asks); then the kernel resumes the run.
function answerInput(model) {
  const choices = model.get("choices") || [];
  const labels = model.get("choice_labels") || [];
  let input;
  if (choices.length) {
    // A person reads each choice as the display door shows it; the option's value is its
    // index, and the choice sent is the kernel's own (two choices may read alike raw).
    input = document.createElement("select");
    choices.forEach((choice, index) => {
      const option = document.createElement("option");
      option.value = String(index);
      option.textContent = labels[index] ?? `choice ${index + 1}`;
      input.appendChild(option);
    });
    const start = choices.indexOf(model.get("typed"));
    if (start >= 0) input.value = String(start);
    input.answer = () => choices[Number(input.value)] ?? "";
    input.addEventListener("input", () => model.set("typed", input.answer()));
  } else {
    // The default is shown through the door (typed_label); sent untouched, it is the
    // default itself (typed). What a person types is both.
    input = document.createElement(model.get("multiline") ? "textarea" : "input");
    input.placeholder = "your answer";
    input.value = model.get("typed_label") || "";
    input.answer = () =>
      input.value === (model.get("typed_label") || "") ? model.get("typed") || "" : input.value;
    input.addEventListener("input", () => {
      model.set("typed_label", input.value);
      model.set("typed", input.value);
    });
  }
  input.className = "widget-input kernelext-answer-input";
  input.style.width = "22em";
  return input;
}

function renderQuestion(model, el) {
  el.classList.add("kernelext-answer-buttons");
  const input = answerInput(model);
  const noteInput = document.createElement("input");
  noteInput.type = "text";
  noteInput.placeholder = "note for the record (optional)";
  noteInput.className = "widget-input";
  noteInput.style.width = "22em";
  noteInput.value = model.get("note") || "";
  noteInput.addEventListener("input", () => model.set("note", noteInput.value));
  const send = makeButton("Answer", "reply", "primary");
  send.classList.add("kernelext-answer");
  send.title = "Store the answer; the run goes on and gets it back from run.ask";
  const note = document.createElement("div");
  note.className = "kernelext-click-note";
  el.append(input, noteInput, send, note);
  const draw = () => {
    const decided = model.get("decided");
    send.disabled = input.disabled = noteInput.disabled = decided;
    if (decided && model.get("answered_text")) note.textContent = model.get("answered_text");
  };
  send.addEventListener("click", async () => {
    send.disabled = true;
    note.textContent = "Answer: sending…";
    const typed = input.answer();
    const extra = { key: model.get("key"), answer: typed, typed: true, note: noteInput.value };
    let answer = null;
    try {
      answer = await sendToServer("answer", model, extra);
    } catch (_err) {
      answer = null;
    }
    if (answer && answer.ours && answer.status === 200) {
      note.textContent = `${answer.body.message} (${clock(new Date())})`;
      model.send({ action: "resume" }); // the kernel resumes the run when it is free
      return;
    }
    if (answer && answer.ours && answer.status < 500) {
      note.textContent = `Answer refused: ${answer.body.message || `HTTP ${answer.status}`}`;
      draw();
      return;
    }
    const answered = await sendToKernel("answer", model, { answer: typed, note: noteInput.value });
    if (!answered) note.textContent = model.get("busy_hint");
    draw();
  });
  model.on("change:decided", draw);
  model.on("change:answered_text", draw);
  model.on("change:kernel_note", () => {
    note.textContent = model.get("kernel_note");
  });
  draw();
}

function render({ model, el }) {
  if (model.get("kind") === "approval") return renderApproval(model, el);
  if (model.get("kind") === "question") return renderQuestion(model, el);
  el.classList.add("kernelext-stop-buttons");
  el.dataset.kernelextRun = model.get("run_id"); // which run's buttons (a row of the overview)
  el.style.display = "inline-flex";
  el.style.flexWrap = "wrap";
  el.style.alignItems = "center";
  el.style.gap = "2px";
  const stop = makeButton("Stop", "stop", "warning");
  const force = makeButton("Force stop", "bolt", "danger");
  const note = document.createElement("span");
  note.className = "kernelext-click-note";
  note.style.margin = "2px 4px 0";
  note.style.flexBasis = "100%";
  note.style.fontSize = "var(--jp-ui-font-size1, 13px)";
  el.append(stop, force, note);

  const draw = () => {
    stop.disabled = model.get("stop_disabled");
    force.disabled = model.get("force_disabled");
    stop.title = model.get("stop_tooltip");
    force.title = model.get("force_tooltip");
  };
  const say = (text) => {
    note.textContent = text;
  };

  const click = async (action, button) => {
    const label = action === "force" ? "Force stop" : "Stop";
    button.disabled = true;
    say(`${label}: sending…`);
    const sent = new Date();
    let answer = null;
    try {
      answer = await sendToServer(action, model);
    } catch (_err) {
      answer = null; // the server cannot be reached
    }
    if (answer && answer.ours && answer.status === 200) {
      say(`${answer.body.message || `${label} recorded`} (${clock(sent)})`);
    } else if (answer && answer.ours && answer.status < 500) {
      say(`${label} refused: ${answer.body.message || `HTTP ${answer.status}`}`);
    } else {
      // No route, or the server could not reach the store (busy, a PostgreSQL server it
      // cannot log in to, a timeout): the kernel may, if it is free.
      const why = answer && answer.ours ? answer.body.message : "";
      const answered = await sendToKernel(action, model);
      if (answered) say(`${label} sent to the kernel (${clock(sent)})`);
      else say(why ? `${why} ${model.get("busy_hint")}` : model.get("busy_hint"));
    }
    draw();
  };
  stop.addEventListener("click", () => click("stop", stop));
  force.addEventListener("click", () => click("force", force));
  for (const name of ["stop_disabled", "force_disabled", "stop_tooltip", "force_tooltip"]) {
    model.on(`change:${name}`, draw);
  }
  model.on("change:kernel_note", () => say(model.get("kernel_note")));
  model.on("change:run_id", () => {
    el.dataset.kernelextRun = model.get("run_id");
  });
  draw();
}

export default { render };
