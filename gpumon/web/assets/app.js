// gpumon serve's page: reads the server's events and lays them out. Every value is set as text
// (textContent, attributes): nothing from the cards, processes or hosts is ever parsed as markup.
"use strict";
(() => {
  const HISTORY = 60; // utilisation points kept per card, in this browser, for its sparkline
  const history = new Map();
  const SVG = "http://www.w3.org/2000/svg";
  const VERDICTS = { ok: "\u2713 OK", warn: "! WARN", fail: "\u2717 FAIL" };
  let lastMessage = 0;
  let interval = 1;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // A moment as every gpumon view shows one (units.format_time): "19:41" today, "Wed 19:41" up to
  // six days before or after, "2026-12-20 19:41" further off; in this browser's time zone.
  const WEEKDAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
  function formatTime(t, seconds) {
    const at = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    const clock = `${pad(at.getHours())}:${pad(at.getMinutes())}${seconds ? `:${pad(at.getSeconds())}` : ""}`;
    const dayNumber = (d) => Math.round(Date.UTC(d.getFullYear(), d.getMonth(), d.getDate()) / 86400000);
    const days = dayNumber(at) - dayNumber(new Date());
    if (days === 0) return clock;
    if (Math.abs(days) <= 6) return `${WEEKDAYS[at.getDay()]} ${clock}`;
    return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())} ${clock}`;
  }

  function na(value, unit) {
    return value === null || value === undefined ? "N/A" : `${value}${unit}`;
  }

  function bar(label, percent, text) {
    const row = el("div", "row");
    row.append(el("span", "label", label));
    const track = el("div", "track");
    const fill = el("div", "fill");
    const shown = percent === null || percent === undefined ? 0 : Math.max(0, Math.min(100, percent));
    fill.style.width = `${shown}%`;
    if (shown >= 90) fill.classList.add("high");
    track.append(fill);
    row.append(track, el("span", "value", text));
    return row;
  }

  function sparkline(points) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", `0 0 ${HISTORY - 1} 100`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-label", "utilisation, last minute");
    let run = [];
    const lines = [];
    const offset = HISTORY - points.length;
    points.forEach((value, i) => {
      if (value === null) { if (run.length) lines.push(run); run = []; return; }
      run.push(`${offset + i},${100 - Math.max(0, Math.min(100, value))}`);
    });
    if (run.length) lines.push(run);
    for (const line of lines) {
      const poly = document.createElementNS(SVG, "polyline");
      poly.setAttribute("points", line.length === 1 ? `${line[0]} ${line[0]}` : line.join(" "));
      svg.append(poly);
    }
    return svg;
  }

  function remember(card) {
    let points = history.get(card.key);
    if (!points) { points = []; history.set(card.key, points); }
    points.push(card.state === "ok" && card.util !== null ? card.util : null);
    if (points.length > HISTORY) points.shift();
    return points;
  }

  function cardView(card) {
    const node = el("article", "card");
    node.dataset.card = card.id;
    node.dataset.verdict = card.verdict;
    node.dataset.free = card.free ? "yes" : "no";
    const head = el("div", "card-head");
    head.append(el("span", "index", `GPU ${card.index}`), el("span", "name", card.name));
    const badge = el("span", `badge ${card.verdict}`, VERDICTS[card.verdict] || card.verdict);
    badge.title = card.reasons.length ? card.reasons.join("\n") : "healthy";
    head.append(badge);
    if (card.free) head.append(el("span", "free", "FREE"));
    node.append(head);
    if (card.state !== "ok") node.append(el("p", "card-state", card.error ? `${card.state}: ${card.error}` : card.state));
    node.append(bar("util", card.util, na(card.util, "%")), sparkline(remember(card)));
    node.append(bar("mem", card.mem_pct, card.mem));
    const facts = el("dl", "facts");
    facts.append(el("dt", null, "temp"), el("dd", "temp", na(card.temp, " \u00b0C")),
      el("dt", null, "power"), el("dd", "power", card.power || "N/A"));
    node.append(facts);
    if (card.state === "ok" || card.owner) node.append(el("p", "owner", card.owner ? `held by ${card.owner}` : "no one holds it"));
    for (const claim of card.claims || []) node.append(el("p", "claim", claim));
    if (card.reservation) node.append(el("p", "reservation", card.reservation));
    for (const use of card.without_claim || []) node.append(el("p", "unclaimed", `Without a claim: ${use}`));
    if (card.reasons.length) {
      const reasons = el("ul", "reasons");
      for (const reason of card.reasons) reasons.append(el("li", null, reason));
      node.append(reasons);
    }
    if (!card.free && card.why_busy && card.state === "ok") node.title = card.why_busy;
    return node;
  }

  function processTable(host) {
    const table = el("table", "procs");
    const head = el("tr");
    for (const name of ["GPU", "PID", "USER", "OWNER", "MEMORY", "COMMAND"]) head.append(el("th", null, name));
    const thead = el("thead");
    thead.append(head);
    table.append(thead);
    const body = el("tbody");
    for (const p of host.processes) {
      const row = el("tr");
      row.append(el("td", "num", p.gpu), el("td", "num", p.pid), el("td", null, p.user ?? ""),
        el("td", "owner", p.owner ?? ""), el("td", "num", p.memory),
        el("td", p.without_claim ? "command unclaimed" : "command",
          (p.without_claim ? `[no claim: ${p.without_claim}] ` : "") + (p.command ?? "")));
      body.append(row);
    }
    table.append(body);
    const wrap = el("div", "procs-wrap");
    wrap.append(table);
    if (host.more_processes) wrap.append(el("p", "more", `and ${host.more_processes} more processes`));
    return wrap;
  }

  function hostView(host, fleet) {
    const section = el("section", "host");
    section.dataset.host = host.name;
    section.dataset.state = host.state;
    const title = el("h2");
    title.append(el("span", "host-name", fleet ? host.name : `${host.name}`));
    title.append(el("span", `host-state ${host.state}`, host.state));
    section.append(title);
    if (host.error) section.append(el("p", "host-error", host.error));
    const grid = el("div", "grid");
    for (const card of host.cards) grid.append(cardView(card));
    section.append(grid);
    if (host.queue && host.queue.length) {
      const queue = el("div", "queue");
      queue.append(el("h3", null, `Queue (${host.queue.length} waiting, first come first served)`));
      const list = el("ol", "queue-list");
      for (const entry of host.queue) list.append(el("li", null, entry.text));
      queue.append(list);
      section.append(queue);
    }
    if (host.processes.length) section.append(processTable(host));
    else if (host.cards.length) section.append(el("p", "no-procs", "No processes on these cards."));
    return section;
  }

  // The users section: a row per user, its jobs, pods and containers under it. An idle row says so
  // in words and a sign ("! idle"), never by colour alone.
  const HOLDER_COLUMNS = [["mark", ""], ["host", "HOST"], ["who", "WHO"], ["user", "USER"], ["cards", "CARDS"],
    ["memory", "MEMORY"], ["sm", "SM %"], ["power", "POWER"], ["energy", "ENERGY"], ["held", "HELD"],
    ["idle_for", "IDLE"]];
  const NUMERIC = new Set(["memory", "sm", "power", "energy", "held", "idle_for"]);

  function holderRow(h, columns) {
    const row = el("tr");
    row.dataset.holder = h.key;
    row.dataset.kind = h.kind;
    row.dataset.idle = h.idle ? "yes" : "no";
    for (const [key] of columns) {
      const cell = el("td", key + (NUMERIC.has(key) ? " num" : ""));
      if (key === "mark") {
        if (h.idle) cell.append(el("span", "idle-mark", "! idle"));
      } else if (key === "who") {
        if (h.branch) cell.append(el("span", "branch", `${h.branch} `));
        cell.append(el("span", "who-name", h.who));
      } else {
        cell.textContent = h[key] ?? "";
      }
      row.append(cell);
    }
    return row;
  }

  function renderUsers(users, fleet) {
    const section = document.getElementById("users");
    section.hidden = false;
    const summary = document.getElementById("users-summary");
    summary.dataset.idle = String(users.idle_count);
    summary.replaceChildren();
    if (users.idle) summary.append(el("span", "users-idle", users.idle), document.createTextNode(" \u00b7 "));
    summary.append(el("span", "users-rest", users.rest));
    const reserved = document.getElementById("users-reserved");
    reserved.replaceChildren(...(users.reservations || []).map((line) => el("li", null, line)));
    const columns = HOLDER_COLUMNS.filter(([key]) => fleet || key !== "host");
    const table = document.getElementById("users-table");
    if (!users.rows.length) { table.replaceChildren(); table.hidden = true; }
    else {
      table.hidden = false;
      const head = el("tr");
      for (const [key, name] of columns) head.append(el("th", NUMERIC.has(key) ? "num" : null, name));
      const thead = el("thead");
      thead.append(head);
      const body = el("tbody");
      for (const h of users.rows) body.append(holderRow(h, columns));
      table.replaceChildren(thead, body);
    }
    document.getElementById("users-more").textContent = users.more ? `and ${users.more} more holders` : "";
  }

  function render(doc) {
    interval = doc.interval || 1;
    document.body.dataset.time = String(doc.time);
    const s = doc.summary;
    const summary = document.getElementById("summary");
    const words = [s.text];
    if (s.failing) words.push(`${s.failing} failing`);
    if (s.warning) words.push(`${s.warning} warning`);
    if (s.away) words.push(`${s.away} host${s.away === 1 ? "" : "s"} not answering`);
    const idle = doc.users ? doc.users.idle_count : 0;
    if (idle) words.push(`${idle} holder${idle === 1 ? "" : "s"} idle`);
    summary.textContent = words.join(" \u00b7 ");
    summary.dataset.free = String(s.free);
    document.getElementById("updated").textContent =
      `updated ${formatTime(doc.time, true)}`;
    const problems = document.getElementById("problems");
    problems.replaceChildren(...(doc.problems || []).map((p) => el("li", null, p)));
    const seen = new Set();
    const sections = doc.hosts.map((host) => {
      host.cards.forEach((c) => seen.add(c.key));
      return hostView(host, doc.fleet);
    });
    for (const key of history.keys()) if (!seen.has(key)) history.delete(key);
    document.getElementById("hosts").replaceChildren(...sections);
    if (doc.users) renderUsers(doc.users, doc.fleet);
  }

  // Small amounts in a unit that shows them: beside a bar scaled to the largest, "0.0 GPU-h" said
  // nothing about a bar drawn at full length.
  function hoursIn(hours, prefix) {
    if (hours >= 1 || hours === 0) return `${hours.toFixed(1)} ${prefix}h`;
    if (hours * 60 >= 1) return `${(hours * 60).toFixed(1)} ${prefix}min`;
    const seconds = hours * 3600;
    return `${seconds.toFixed(seconds >= 10 ? 0 : 1)} ${prefix}s`;
  }

  function energyIn(kwh) {
    if (kwh >= 1 || kwh === 0) return `${kwh.toFixed(1)} kWh`;
    const wh = kwh * 1000;
    return `${wh.toFixed(wh >= 10 ? 0 : 1)} Wh`;
  }

  // The "last 7 days" section: /api/report (the usage ledger), asked on load and every 5 minutes.
  function renderUsage(doc) {
    document.getElementById("usage").hidden = false;
    const users = doc.rows.filter((r) => r.kind === "user");
    const most = Math.max(0, ...users.map((r) => r.gpu_hours));
    document.getElementById("usage-note").textContent = doc.error ? doc.error
      : users.length ? "GPU-hours per user (the idle-held part shaded)" : "nobody held a card";
    document.getElementById("usage-users").replaceChildren(...users.map((r) => {
      const row = el("div", "usage-user");
      row.dataset.user = r.id;
      row.append(el("span", "label", r.label));
      const track = el("div", "track");
      const fill = el("div", "fill");
      fill.style.width = `${most ? (100 * r.gpu_hours) / most : 0}%`;
      const idle = el("div", "idle");
      idle.style.width = `${r.gpu_hours ? (100 * r.idle_hours) / r.gpu_hours : 0}%`;
      fill.append(idle);
      track.append(fill);
      const words = [`${hoursIn(r.gpu_hours, "GPU-")}`, energyIn(r.energy_kwh)];
      if (r.idle_hours) words.push(`${hoursIn(r.idle_hours, "")} idle`);
      row.append(track, el("span", "value", words.join(" \u00b7 ")));
      return row;
    }));
    const days = [...new Set(doc.days.map((d) => d.day))].sort();
    const byCard = new Map();
    for (const d of doc.days) {
      const key = `${d.host} ${d.card}`;
      if (!byCard.has(key)) byCard.set(key, { index: d.index, host: d.host, days: new Map() });
      byCard.get(key).days.set(d.day, d.mean_util);
    }
    const lastUse = new Map(doc.cards.map((c) => [`${c.host} ${c.card}`, c.last_used]));
    document.getElementById("usage-cards").replaceChildren(...[...byCard.entries()].map(([key, card]) => {
      const row = el("div", "usage-card");
      row.dataset.card = String(card.index);
      row.append(el("span", "label", `GPU ${card.index}`));
      const strip = el("div", "strip");
      for (const day of days) {
        const util = card.days.get(day);
        const cell = el("span", "day");
        cell.style.opacity = util === undefined || util === null ? "0.08" : String(0.15 + (0.85 * util) / 100);
        cell.title = `${day}: ${util === undefined || util === null ? "not watched" : `${util}% utilisation`}`;
        strip.append(cell);
      }
      const last = lastUse.get(key);
      row.append(strip, el("span", "value", last ? `last used ${formatTime(last)}` : "unused"));
      return row;
    }));
  }

  function loadUsage() {
    fetch("api/report", { credentials: "same-origin" })
      .then((response) => (response.ok ? response.json() : null))
      .then((doc) => { if (doc) renderUsage(doc); })
      .catch(() => {});
  }

  function connection(state, text) {
    const node = document.getElementById("connection");
    node.dataset.state = state;
    node.textContent = text;
  }

  function start() {
    loadUsage();
    setInterval(loadUsage, 5 * 60 * 1000);
    const events = new EventSource("events");
    events.onopen = () => connection("live", "live");
    events.onmessage = (message) => {
      lastMessage = Date.now();
      connection("live", "live");
      render(JSON.parse(message.data));
    };
    events.onerror = () => {
      if (events.readyState === EventSource.CLOSED) {
        connection("closed", "disconnected: reload the page (with the ?token=\u2026 address gpumon serve printed)");
      } else {
        connection("reconnecting", "reconnecting\u2026");
      }
    };
    setInterval(() => {
      const quiet = (Date.now() - lastMessage) / 1000;
      if (lastMessage && quiet > 3 * interval + 2) connection("quiet", `no news for ${Math.round(quiet)} s`);
    }, 1000);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
