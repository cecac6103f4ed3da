"use strict";
(function () {
  const data = JSON.parse(document.getElementById("explorer-data").textContent);
  const pairs = data.pairs;
  const CHUNK = 100;
  const $ = (id) => document.getElementById(id);
  const list = $("cards"), more = $("more"), count = $("count");
  const filters = {outcome: $("f-outcome"), mode: $("f-mode"), marker: $("f-marker"),
                   attribute: $("f-attribute"), wrong: $("f-wrong"), search: $("f-search"),
                   members: $("f-members")};
  let shown = [], rendered = 0;

  const escape = (text) => String(text).replace(/[&<>"']/g, (c) => (
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
  const rows = (p) => p.st || p.ps || [];

  // Search text and attributes, once.
  for (const p of pairs) {
    p.text = (p.id + " " + p.s.flat().join(" ") + " " + (p.ex || "")).toLowerCase();
    p.attrs = new Set(rows(p).map((r) => r[1]));
    p.wrongAttrs = new Set((p.st || []).filter((r) => r[6] === "wrong").map((r) => r[1]));
  }

  function addOptions(select, values, countOf) {
    if (!select) return;
    for (const [value, label] of values) {
      const option = document.createElement("option");
      option.value = value;
      option.textContent = label + " (" + countOf(value) + ")";
      select.appendChild(option);
    }
  }
  const tally = (key) => (value) => pairs.filter((p) => String(p[key]) === value).length;
  addOptions(filters.outcome, data.outcomes.map((o) => [o, o]), tally("out"));
  addOptions(filters.mode, data.modes.map((m, x) => [String(x), m]), tally("fm"));
  const attributes = [...new Set(pairs.flatMap((p) => [...p.attrs]))].sort();
  addOptions(filters.attribute, attributes.map((a) => [a, a]),
             (a) => pairs.filter((p) => p.attrs.has(a)).length);

  function matches(p) {
    const f = filters;
    if (f.outcome && f.outcome.value && p.out !== f.outcome.value) return false;
    if (f.mode && f.mode.value && String(p.fm) !== f.mode.value) return false;
    if (f.marker && f.marker.value && p.cur !== (f.marker.value === "curated")) return false;
    if (f.members && f.members.value && p.agr !== (f.members.value === "agree")) return false;
    const wrongOnly = f.wrong && f.wrong.checked;
    if (f.attribute.value) {
      if (!(wrongOnly ? p.wrongAttrs : p.attrs).has(f.attribute.value)) return false;
    } else if (wrongOnly && p.wrongAttrs.size === 0) return false;
    const words = f.search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    return words.every((w) => p.text.includes(w));
  }

  function storyHtml(p, k) {
    const gold = data.gold && p.lab !== undefined;
    const goldMarks = gold && k === 1 - p.lab ? new Set(p.gc) : new Set();
    const predMarks = p.pred === 1 - k ? new Set(gold ? p.pc : (p.ec || [])) : new Set();
    const says = [];
    if (gold) says.push('gold <span class="' + (p.lab === k ? "plausible\">plausible" : "implausible\">implausible") + "</span>");
    if (p.pred !== undefined) says.push('predicted <span class="' + (p.pred === k ? "plausible\">plausible" : "implausible\">implausible") + "</span>");
    let html = '<div class="story"><h3>Story ' + (k + 1) + (says.length ? ' <span class="meta">' + says.join(" · ") + "</span>" : "") + "</h3><ol>";
    p.s[k].forEach((sentence, s) => {
      const g = goldMarks.has(s), q = predMarks.has(s);
      html += '<li class="' + (g ? "g " : "") + (q ? "p" : "") + '">' + escape(sentence) +
        (g ? '<span class="tag g" title="gold conflicting sentence">gold</span>' : "") +
        (q ? '<span class="tag p" title="predicted conflicting sentence">predicted</span>' : "") + "</li>";
    });
    return html + "</ol></div>";
  }

  function statesHtml(p) {
    if (p.st) {
      if (!p.st.length) return '<p class="states meta">No nontrivial gold or predicted state at the gold conflict.</p>';
      let html = '<table class="states"><caption>States that decide verifiability (story ' + (2 - p.lab) +
        ": effects at the evidence sentence, preconditions at the breakpoint)</caption>" +
        "<tr><th>Entity</th><th>Attribute</th><th>At</th><th>Gold</th><th>Predicted</th><th></th></tr>";
      for (const [entity, attribute, side, sentence, gold, pred, mark] of p.st) {
        const sign = {wrong: "✗ wrong", right: "✓", missed: "not predicted (not counted)"}[mark];
        html += '<tr class="' + mark + '"><td>' + escape(entity) + "</td><td>" + escape(attribute) +
          "</td><td>" + side + ", sentence " + (sentence + 1) + "</td><td>" + escape(gold) +
          "</td><td>" + escape(pred) + '</td><td class="mark">' + sign + "</td></tr>";
      }
      return html + "</table>";
    }
    if (!p.ps || !p.ps.length) return "";
    let html = '<table class="states"><caption>Predicted states at the conflicting sentences</caption>' +
      "<tr><th>Entity</th><th>Attribute</th><th>At</th><th>Predicted</th></tr>";
    for (const [entity, attribute, side, sentence, value] of p.ps) {
      html += "<tr><td>" + escape(entity) + "</td><td>" + escape(attribute) + "</td><td>" + side +
        ", sentence " + (sentence + 1) + "</td><td>" + escape(value) + "</td></tr>";
    }
    return html + "</table>";
  }

  function votesHtml(p) {
    if (!p.mv) return "";
    const items = p.mv.map(([name, story, conflict, out]) => "<li>" + escape(name) + ": story " +
      (story + 1) + " plausible, sentences " + (conflict.length ? conflict.map((s) => s + 1).join(", ") : "none") +
      (out ? " (" + out + ")" : "") + "</li>");
    return '<details class="votes"><summary>Members: ' + (p.agr ? "all agree" : "disagree") +
      "</summary><ul>" + items.join("") + "</ul></details>";
  }

  function card(p) {
    const article = document.createElement("article");
    article.className = "card";
    article.id = "pair-" + p.id;
    let head = '<h2><a href="#' + escape(encodeURIComponent(article.id)) + '">' + escape(p.id) + "</a>";
    if (p.out) head += '<span class="badge ' + p.out.replace(" ", "-") + '">' + p.out + "</span>" +
      '<span class="meta">' + escape(data.modes[p.fm]) + "</span>";
    if (p.cur !== undefined && p.cur !== null) head += '<span class="badge">' + (p.cur ? "curated" : "implicit") + "</span>";
    if (p.dec && Object.keys(p.dec).length > 1) {
      head += '<span class="meta">' + Object.entries(p.dec).map(([m, o]) => escape(m) + ": " + o).join(" · ") + "</span>";
    }
    if (p.weak) head += '<span class="meta">weak conflict (belief below 0.5)</span>';
    if (p.mv) head += '<span class="badge">' + (p.agr ? "members agree" : "members disagree") + "</span>";
    head += "</h2>";
    const body = p.note && !p.s[0].length ? "" :
      '<div class="stories">' + storyHtml(p, 0) + storyHtml(p, 1) + "</div>" + statesHtml(p) + votesHtml(p) +
      (p.ex ? '<p class="explanation">' + escape(p.ex) + "</p>" : "");
    article.innerHTML = head + (p.note ? '<p class="note">' + escape(p.note) + "</p>" : "") + body;
    return article;
  }

  function renderMore() {
    const end = Math.min(rendered + CHUNK, shown.length);
    const fragment = document.createDocumentFragment();
    for (; rendered < end; rendered++) fragment.appendChild(card(shown[rendered]));
    list.appendChild(fragment);
    more.hidden = rendered >= shown.length;
  }

  function apply() {
    shown = pairs.filter(matches);
    list.textContent = "";
    rendered = 0;
    renderMore();
    count.textContent = shown.length + " of " + pairs.length + " pairs shown";
  }

  function showTarget() {
    const id = decodeURIComponent(location.hash.slice(1));
    if (!id.startsWith("pair-")) return;
    let at = shown.findIndex((p) => "pair-" + p.id === id);
    if (at < 0 && pairs.some((p) => "pair-" + p.id === id)) {
      for (const f of Object.values(filters)) {
        if (f && f.type === "checkbox") f.checked = false; else if (f) f.value = "";
      }
      apply();
      at = shown.findIndex((p) => "pair-" + p.id === id);
    }
    if (at < 0) return;
    while (rendered <= at) renderMore();
    for (const old of document.querySelectorAll(".card.target")) old.classList.remove("target");
    const element = document.getElementById(id);
    element.classList.add("target");
    element.scrollIntoView();
  }

  for (const f of Object.values(filters)) if (f) f.addEventListener(f.type === "search" ? "input" : "change", apply);
  const observer = new IntersectionObserver((entries) => {
    if (!entries.some((e) => e.isIntersecting) || more.hidden) return;
    renderMore();
    observer.unobserve(more);  // observing again reports at once if it is still in view
    observer.observe(more);
  }, {rootMargin: "800px"});
  observer.observe(more);
  window.addEventListener("hashchange", showTarget);
  apply();
  showTarget();
})();
