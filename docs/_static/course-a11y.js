// pydata-sphinx-theme makes a code block focusable (tabindex 0) when it scrolls sideways, but
// measures only on load, resize and DOM changes: a CJK font that arrives later can widen a
// block into scrolling without a tab stop. Measure again once every font is in.
document.fonts.ready.then(() => window.dispatchEvent(new Event("resize")));
