// The lessons' graph pictures (inline SVG, docs/course_gallery.py): a click or tap on a graph, or
// the button below it, opens the graph full size in a dialog that pans (drag, arrow keys) and
// zooms (wheel, pinch, + and -); there a tap, click or Tab on a node shows its tooltip (op,
// dtype/shape, weights, source line), which touch screens never show on hover. No library, no
// request: this file is the whole viewer (tests/test_site.py drives it).
(() => {
  "use strict";
  const TEXT = {
    en: {
      open: "Open full size",
      openTitle: "Open this graph full size, with pan and zoom",
      zoomIn: "Zoom in",
      zoomOut: "Zoom out",
      actual: "Full size",
      actualTitle: "Show the graph at its own size (key 0)",
      fit: "Fit",
      fitTitle: "Fit the whole graph in the window",
      close: "Close",
      viewLabel: "{title}: drag or use the arrow keys to move, + and − to zoom; Tab to a node, or tap it, for its details",
      hint: "Tap, click or Tab to a node for its details (op, dtype and shape, weights, source line).",
    },
    zh: {
      open: "放大檢視",
      openTitle: "以原始大小開啟這張圖，可以拖曳與縮放",
      zoomIn: "放大",
      zoomOut: "縮小",
      actual: "原始大小",
      actualTitle: "以圖的原始大小顯示（按鍵 0）",
      fit: "整張",
      fitTitle: "把整張圖放進視窗",
      close: "關閉",
      viewLabel: "{title}：拖曳或用方向鍵移動，按 + 與 − 縮放；用 Tab 移到 node 或點一下 node，可看它的詳細資訊",
      hint: "點一下 node，或用 Tab 移到 node，可看它的詳細資訊（op、dtype 與 shape、weight、原始碼行）。",
    },
  };
  const text = TEXT[(document.documentElement.lang || "en").startsWith("zh") ? "zh" : "en"];
  const MIN = 0.1;
  const MAX = 8;

  let dialog, view, stage, info, zoomShown, titleShown, opener;
  let scale = 1;
  let x = 0;
  let y = 0;
  let size = { width: 0, height: 0 };

  function button(label, title, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    if (title) b.title = title;
    b.addEventListener("click", onClick);
    return b;
  }

  function graphTitle(svg) {
    const drawn = svg.querySelector("g.graph > text");
    return (drawn && drawn.textContent) || (svg.getAttribute("aria-label") || "").split(". ")[0];
  }

  function apply() {
    stage.style.transform = `translate(${x}px, ${y}px) scale(${scale})`;
    zoomShown.textContent = `${Math.round(scale * 100)} %`;
  }

  function zoomAt(factor, cx, cy) {
    const next = Math.min(MAX, Math.max(MIN, scale * factor));
    x = cx - ((cx - x) * next) / scale;
    y = cy - ((cy - y) * next) / scale;
    scale = next;
    apply();
  }

  function zoomCentre(factor) {
    zoomAt(factor, view.clientWidth / 2, view.clientHeight / 2);
  }

  function actualSize() {
    scale = 1;
    // Centred where the graph is narrower or shorter than the window, else from its top left.
    x = Math.max(0, (view.clientWidth - size.width) / 2);
    y = Math.max(0, (view.clientHeight - size.height) / 2);
    apply();
  }

  function fit() {
    scale = Math.min(1, view.clientWidth / size.width, view.clientHeight / size.height);
    x = (view.clientWidth - size.width * scale) / 2;
    y = (view.clientHeight - size.height * scale) / 2;
    apply();
  }

  function show(node) {
    stage.querySelectorAll("g.node.course-graph-picked").forEach((n) => {
      n.classList.remove("course-graph-picked");
    });
    if (!node) {
      info.textContent = text.hint;
      return;
    }
    node.classList.add("course-graph-picked");
    const title = node.querySelector(":scope > title");
    info.textContent = title ? title.textContent : "";
  }

  // Bring a node into the window (it may be off screen at full size).
  function reveal(node) {
    const box = node.getBoundingClientRect();
    const frame = view.getBoundingClientRect();
    const margin = 24;
    if (box.left < frame.left + margin || box.right > frame.right - margin) {
      x += frame.left + frame.width / 2 - (box.left + box.width / 2);
    }
    if (box.top < frame.top + margin || box.bottom > frame.bottom - margin) {
      y += frame.top + frame.height / 2 - (box.top + box.height / 2);
    }
    apply();
  }

  function build() {
    dialog = document.createElement("dialog");
    dialog.className = "course-graph-viewer";
    const bar = document.createElement("div");
    bar.className = "course-graph-viewer__bar";
    titleShown = document.createElement("h2");
    titleShown.className = "course-graph-viewer__title";
    titleShown.id = "course-graph-viewer-title";
    dialog.setAttribute("aria-labelledby", titleShown.id);
    zoomShown = document.createElement("span");
    zoomShown.className = "course-graph-viewer__zoom";
    zoomShown.setAttribute("aria-live", "polite");
    const zoomOut = button("−", text.zoomOut, () => zoomCentre(1 / 1.25));
    zoomOut.setAttribute("aria-label", text.zoomOut);
    const zoomIn = button("+", text.zoomIn, () => zoomCentre(1.25));
    zoomIn.setAttribute("aria-label", text.zoomIn);
    const close = button(text.close, "", () => dialog.close());
    close.className = "course-graph-viewer__close";
    bar.append(
      titleShown,
      zoomOut,
      zoomShown,
      zoomIn,
      button(text.actual, text.actualTitle, actualSize),
      button(text.fit, text.fitTitle, fit),
      close,
    );
    view = document.createElement("div");
    view.className = "course-graph-viewer__view";
    view.tabIndex = 0;
    view.setAttribute("role", "group");
    stage = document.createElement("div");
    stage.className = "course-graph-viewer__stage";
    view.append(stage);
    info = document.createElement("p");
    info.className = "course-graph-viewer__info";
    info.setAttribute("aria-live", "polite");
    dialog.append(bar, view, info);
    document.body.append(dialog);

    // Pan with one pointer, pinch with two; a pointer that barely moved is a tap.
    const pointers = new Map();
    let moved = 0;
    let pinch = 0;
    view.addEventListener("pointerdown", (e) => {
      pointers.set(e.pointerId, { x: e.clientX, y: e.clientY });
      if (pointers.size === 1) moved = 0;
      view.setPointerCapture(e.pointerId);
    });
    view.addEventListener("pointermove", (e) => {
      const last = pointers.get(e.pointerId);
      if (!last) return;
      const now = { x: e.clientX, y: e.clientY };
      if (pointers.size === 1) {
        x += now.x - last.x;
        y += now.y - last.y;
        moved += Math.abs(now.x - last.x) + Math.abs(now.y - last.y);
        apply();
      } else if (pointers.size === 2) {
        pointers.set(e.pointerId, now);
        const [a, b] = [...pointers.values()];
        const distance = Math.hypot(a.x - b.x, a.y - b.y);
        const frame = view.getBoundingClientRect();
        if (pinch) zoomAt(distance / pinch, (a.x + b.x) / 2 - frame.left, (a.y + b.y) / 2 - frame.top);
        pinch = distance;
        moved = Infinity;
      }
      pointers.set(e.pointerId, now);
    });
    const up = (e) => {
      if (!pointers.has(e.pointerId)) return;
      pointers.delete(e.pointerId);
      if (pointers.size < 2) pinch = 0;
      if (pointers.size === 0 && moved < 6 && e.type === "pointerup") {
        const hit = document.elementFromPoint(e.clientX, e.clientY);
        const node = hit && hit.closest(".course-graph-viewer__stage g.node");
        show(node);
      }
    };
    view.addEventListener("pointerup", up);
    view.addEventListener("pointercancel", up);
    view.addEventListener(
      "wheel",
      (e) => {
        e.preventDefault();
        const frame = view.getBoundingClientRect();
        zoomAt(Math.exp(-e.deltaY / 300), e.clientX - frame.left, e.clientY - frame.top);
      },
      { passive: false },
    );
    view.addEventListener("keydown", (e) => {
      if (e.target !== view) return;
      const step = e.shiftKey ? 200 : 50;
      const moves = {
        ArrowLeft: [step, 0],
        ArrowRight: [-step, 0],
        ArrowUp: [0, step],
        ArrowDown: [0, -step],
      };
      if (moves[e.key]) {
        x += moves[e.key][0];
        y += moves[e.key][1];
        apply();
      } else if (e.key === "+" || e.key === "=") {
        zoomCentre(1.25);
      } else if (e.key === "-" || e.key === "_") {
        zoomCentre(1 / 1.25);
      } else if (e.key === "0") {
        actualSize();
      } else {
        return;
      }
      e.preventDefault();
    });
    stage.addEventListener("focusin", (e) => {
      const node = e.target.closest("g.node");
      if (node) {
        show(node);
        reveal(node);
      }
    });
    // Escape closes the dialog (Chromium skips its own cancel after a script moved the focus).
    dialog.addEventListener("keydown", (e) => {
      if (e.key === "Escape") {
        e.preventDefault();
        dialog.close();
      }
    });
    dialog.addEventListener("close", () => {
      stage.replaceChildren();
      if (opener) opener.focus();
    });
  }

  function open(svg, trigger, picked) {
    if (!dialog) build();
    opener = trigger;
    const copy = svg.cloneNode(true);
    // The copy is drawn at the picture's own size: its width and height attributes (pt).
    size = { width: svg.width.baseVal.value, height: svg.height.baseVal.value };
    copy.removeAttribute("class");
    copy.style.width = `${size.width}px`;
    copy.style.height = `${size.height}px`;
    copy.setAttribute("role", "group");
    const nodes = [...copy.querySelectorAll("g.node")];
    nodes.forEach((node) => {
      const title = node.querySelector(":scope > title");
      node.setAttribute("tabindex", "0");
      node.setAttribute("role", "button");
      if (title) node.setAttribute("aria-label", title.textContent.replace(/\n/g, "; "));
    });
    stage.replaceChildren(copy);
    titleShown.textContent = graphTitle(svg);
    view.setAttribute("aria-label", text.viewLabel.replace("{title}", graphTitle(svg)));
    dialog.showModal();
    actualSize();
    const index = picked ? [...svg.querySelectorAll("g.node")].indexOf(picked) : -1;
    if (index >= 0) {
      show(nodes[index]);
      reveal(nodes[index]);
    } else {
      show(null);
    }
    view.focus();
  }

  function setUp() {
    document.querySelectorAll("article svg.course-graph").forEach((svg) => {
      if (svg.dataset.courseGraph) return;
      svg.dataset.courseGraph = "1";
      svg.classList.add("course-graph-zoomable");
      const openButton = button(text.open, text.openTitle, () => open(svg, openButton, null));
      openButton.className = "course-graph-open";
      svg.after(openButton);
      svg.addEventListener("click", (e) => {
        open(svg, openButton, e.target.closest && e.target.closest("g.node"));
      });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setUp);
  } else {
    setUp();
  }
})();
