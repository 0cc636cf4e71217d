// What does not fit, measured in the browser (used by docs/layout.py, run by headless Chromium).
//
// docs/layout.py writes a harness page that loads every page of the site in iframes, one per
// page and width (an iframe's width is its page's viewport: the CSS lays it out as a window of
// that width), and this script. When everything has loaded it measures each page and writes
// the results, as JSON, into <pre id="layout-results">, which Chromium's --dump-dom prints.
"use strict";

const SLACK = 1;  // px: sub-pixel rounding

function describe(el) {
  const cls = el.classList.length ? "." + [...el.classList].join(".") : "";
  return el.tagName.toLowerCase() + cls + (el.id ? "#" + el.id : "");
}

// The outermost elements of `elements` (an element inside another one listed is dropped).
function outermost(elements) {
  return elements.filter((el) => !elements.some((other) => other !== el && other.contains(el)));
}

function measure(doc, width) {
  const problems = [];
  const view = doc.defaultView;
  const all = [...doc.body.querySelectorAll("*")];

  // Nothing runs past the right edge of the window (the page would scroll sideways).
  const page = doc.documentElement.scrollWidth;
  if (page > width + SLACK) {
    const past = outermost(all.filter((el) => el.getBoundingClientRect().right > width + SLACK));
    problems.push(`the page is ${page} px wide in a ${width} px window: `
      + past.slice(0, 4).map(describe).join(", ") + " run past the right edge");
  }
  // Nothing is cut off by an element that hides its overflow.
  for (const el of all) {
    const overflow = view.getComputedStyle(el).overflowX;
    if ((overflow === "hidden" || overflow === "clip") && el.scrollWidth > el.clientWidth + SLACK) {
      problems.push(`${describe(el)} cuts its content off: ${el.scrollWidth} px in ${el.clientWidth} px`);
    }
  }
  // Every equation fits its box, whole: not clipped, not even scrolled.
  doc.querySelectorAll("math").forEach((math, i) => {
    const tex = math.getAttribute("alttext") || "";
    const name = `equation ${i + 1} (${tex.slice(0, 40)}${tex.length > 40 ? "..." : ""})`;
    if (math.scrollWidth > math.clientWidth + SLACK) {
      problems.push(`${name} is ${math.scrollWidth} px wide in ${math.clientWidth} px`);
    }
    const box = math.closest(".equations") || math.parentElement;
    const inner = box.getBoundingClientRect();
    const style = view.getComputedStyle(box);
    const right = inner.right - parseFloat(style.borderRightWidth) - parseFloat(style.paddingRight);
    const left = inner.left + parseFloat(style.borderLeftWidth) + parseFloat(style.paddingLeft);
    for (const part of math.querySelectorAll("*")) {
      const rect = part.getBoundingClientRect();
      if (rect.width && (rect.right > right + SLACK || rect.left < left - SLACK)) {
        problems.push(`${name} sticks out of its box (${describe(box)}) by `
          + `${Math.round(Math.max(rect.right - right, left - rect.left))} px`);
        break;
      }
    }
  });
  for (const box of doc.querySelectorAll(".equations")) {
    if (box.scrollWidth > box.clientWidth + SLACK) {
      problems.push(`the equations' box scrolls: ${box.scrollWidth} px in ${box.clientWidth} px`);
    }
  }
  // Code wraps inside its column: never cut, never scrolled.
  for (const pre of doc.querySelectorAll("pre")) {
    if (pre.scrollWidth > pre.clientWidth + SLACK) {
      const cell = pre.closest(".cell");
      problems.push(`code in ${describe(cell || pre)} is ${pre.scrollWidth} px wide in ${pre.clientWidth} px`);
    }
  }
  // Where the columns are: the first row of column heads of each three-column section.
  const columns = [...doc.querySelectorAll(".columns")].map((section) =>
    [...section.querySelectorAll(":scope > .colhead")].map((head) => {
      const rect = head.getBoundingClientRect();
      return {backend: head.className.replace(/.*col-/, ""), left: rect.left, right: rect.right, top: rect.top};
    }));
  return {problems, columns, wrapped: wrappedLines(doc)};
}

// The source lines of the three-column sections that wrapped: a line's block (docs/pages.py's
// highlight_python writes one <span class="line"> per source line) is taller than one line.
function wrappedLines(doc) {
  const wrapped = [];
  for (const pre of doc.querySelectorAll(".columns pre")) {
    const lines = [...pre.querySelectorAll("span.line")];
    const heights = lines.map((line) => line.getBoundingClientRect().height);
    const one = parseFloat(doc.defaultView.getComputedStyle(pre).lineHeight) || Math.min(...heights);
    lines.forEach((line, i) => {
      if (heights[i] > one * 1.5) {
        const number = line.querySelector(".linenos");
        const text = [...line.childNodes].filter((node) => node !== number).map((node) => node.textContent).join("");
        const cell = pre.closest(".cell");
        wrapped.push({
          backend: cell ? cell.className.replace(/.*col-(\w+).*/, "$1") : "?",
          line: number ? Number(number.textContent) : null,
          chars: text.length,
          text: text.trim().slice(0, 40),
          rows: Math.round(heights[i] / one),
        });
      }
    });
  }
  return wrapped;
}

window.addEventListener("load", () => {
  const results = {};
  for (const frame of document.querySelectorAll("iframe")) {
    const key = `${frame.dataset.page} ${frame.dataset.width}`;
    const doc = frame.contentDocument;
    results[key] = doc && doc.body
      ? measure(doc, Number(frame.dataset.width))
      : {problems: ["the page did not load"], columns: [], wrapped: []};
  }
  document.getElementById("layout-results").textContent = JSON.stringify(results);
});
