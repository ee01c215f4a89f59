// eatta's labelling page: shows the first pending request the server lists (newest first by
// default, eatta-annotate serve --order), sends the person's answer.
// Plain JS, no dependencies. Text from the server is set with textContent only.
"use strict";

(() => {
  const POLL_MS = 1000;
  const TYPE_MS = 900; // digits typed within this time form one number (more than 10 classes)
  const $ = (id) => document.getElementById(id);
  const state = {
    items: [],
    current: null,
    shownAt: 0,
    highlight: 0,
    typed: "",
    typedAt: 0,
    busy: false,
    timer: null,
  };

  async function api(path, options) {
    const response = await fetch(path, { credentials: "same-origin", ...options });
    let data = null;
    try {
      data = await response.json();
    } catch (err) {
      data = { error: `${response.status} ${response.statusText}` };
    }
    return { ok: response.ok, status: response.status, data };
  }

  function percent(x) {
    return `${Math.round(100 * x)} %`;
  }

  function showStats(s) {
    $("stat-pending").textContent = String(s.pending);
    $("stat-answered").textContent = s.skipped ? `${s.answered} (${s.skipped} skipped)` : String(s.answered);
    $("stat-pace").textContent =
      s.median_seconds === null ? "–" : `${s.median_seconds.toFixed(1)} (mean ${s.mean_seconds.toFixed(1)})`;
    $("stat-right").textContent =
      s.selected_accuracy === null ? "–" : `${percent(s.selected_accuracy)} of ${s.selected_judged}`;
    const m = s.monitor;
    $("stat-audit").textContent =
      !m || !m.audits
        ? "–"
        : `${percent(m.adapted)} [${percent(m.adapted_low)}, ${percent(m.adapted_high)}] vs source ` +
          `${percent(m.source)} [${percent(m.source_low)}, ${percent(m.source_high)}] of ${m.audits}` +
          (m.resets ? `, ${m.resets} reset${m.resets > 1 ? "s" : ""}` : "");
  }

  function age(created) {
    const seconds = Math.max(0, Date.now() / 1000 - created);
    return seconds < 90 ? `${Math.round(seconds)} s` : `${Math.round(seconds / 60)} min`;
  }

  function setHighlight(k) {
    const item = state.current;
    if (!item) return;
    const n = item.classes.length;
    state.highlight = ((k % n) + n) % n;
    for (const b of $("classes").children) {
      b.classList.toggle("highlight", Number(b.dataset.class) === state.highlight);
    }
  }

  function show(item) {
    state.current = item;
    if (!item) {
      $("current").hidden = true;
      $("empty").hidden = false;
      return;
    }
    $("current").hidden = false;
    $("empty").hidden = true;
    $("current").dataset.id = item.id;
    $("current-id").textContent = item.id;
    $("current-age").textContent = age(item.created);
    if (item.image) {
      $("sample").src = item.image;
      $("sample").hidden = false;
    } else {
      $("sample").removeAttribute("src");
      $("sample").hidden = true;
    }
    $("pred-name").textContent = item.prediction_name;
    $("pred-conf").textContent = `(confidence ${percent(item.confidence)})`;
    const box = $("classes");
    box.replaceChildren();
    item.classes.forEach((name, k) => {
      const b = document.createElement("button");
      b.type = "button";
      b.dataset.class = String(k);
      b.textContent = name === String(k) ? name : `${k} ${name}`;
      b.title = `class ${k}: ${name}`;
      if (k === item.prediction) b.classList.add("predicted");
      b.addEventListener("click", () => send({ label: k }));
      box.appendChild(b);
    });
    state.typed = "";
    setHighlight(item.prediction);
    state.shownAt = performance.now();
  }

  function showNext() {
    const list = $("next");
    list.replaceChildren();
    const rest = state.items.filter((it) => !state.current || it.id !== state.current.id);
    $("next-title").hidden = rest.length === 0;
    for (const it of rest.slice(0, 24)) {
      const li = document.createElement("li");
      if (it.image) {
        const img = document.createElement("img");
        img.src = it.image;
        img.alt = `request ${it.id}`;
        li.appendChild(img);
      }
      li.appendChild(document.createTextNode(it.prediction_name));
      list.appendChild(li);
    }
  }

  async function refresh() {
    const [pending, stats] = await Promise.all([api("/api/pending"), api("/api/stats")]);
    if (stats.ok) showStats(stats.data);
    if (!pending.ok) {
      $("message").textContent = pending.data.error || `error ${pending.status}`;
      return;
    }
    state.items = pending.data;
    const still = state.current && state.items.find((it) => it.id === state.current.id);
    if (!still && !state.busy) show(state.items[0] || null);
    else if (still) $("current-age").textContent = age(still.created);
    showNext();
  }

  function schedule() {
    clearTimeout(state.timer);
    state.timer = setTimeout(async () => {
      try {
        await refresh();
      } catch (err) {
        $("message").textContent = `cannot reach the server (${err}); retrying`;
      }
      schedule();
    }, POLL_MS);
  }

  function setBusy(busy) {
    state.busy = busy;
    for (const b of document.querySelectorAll("#current button")) b.disabled = busy;
  }

  async function send(fields) {
    const item = state.current;
    if (!item || state.busy) return;
    setBusy(true);
    const seconds = Math.min(86400, (performance.now() - state.shownAt) / 1000);
    let result;
    try {
      result = await api("/api/answers", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ id: item.id, ...fields, seconds }),
      });
    } catch (err) {
      $("message").textContent = `not sent (${err}); try again`;
      setBusy(false);
      return;
    }
    setBusy(false);
    if (result.ok) {
      $("message").textContent = "";
      document.body.dataset.answered = String(Number(document.body.dataset.answered || 0) + 1);
    } else {
      $("message").textContent = result.data.error || `error ${result.status}`;
    }
    state.items = state.items.filter((it) => it.id !== item.id);
    show(state.items[0] || null);
    try {
      await refresh();
    } catch (err) {
      $("message").textContent = `cannot reach the server (${err}); retrying`;
    }
  }

  document.addEventListener("keydown", (event) => {
    const item = state.current;
    if (!item || event.ctrlKey || event.metaKey || event.altKey) return;
    const n = item.classes.length;
    const key = event.key;
    if (/^[0-9]$/.test(key)) {
      const now = performance.now();
      state.typed = n > 10 && now - state.typedAt < TYPE_MS ? state.typed + key : key;
      state.typedAt = now;
      const k = Number(state.typed);
      if (k < n) setHighlight(k);
      else state.typed = key;
    } else if (key === "ArrowRight" || key === "ArrowDown") {
      setHighlight(state.highlight + 1);
    } else if (key === "ArrowLeft" || key === "ArrowUp") {
      setHighlight(state.highlight - 1);
    } else if (key === "Enter") {
      send({ label: state.highlight });
    } else if (key === "y") {
      send({ correct: true });
    } else if (key === "n") {
      send({ correct: false });
    } else if (key === "s") {
      send({ skip: true });
    } else {
      return;
    }
    event.preventDefault();
  });

  $("yes").addEventListener("click", () => send({ correct: true }));
  $("no").addEventListener("click", () => send({ correct: false }));
  $("skip").addEventListener("click", () => send({ skip: true }));
  refresh().catch((err) => {
    $("message").textContent = `cannot reach the server (${err})`;
  }).finally(schedule);
})();
