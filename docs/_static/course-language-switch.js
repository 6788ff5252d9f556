// The language switch keeps the reader's section: a lesson's section ids are its English twin's
// in both languages (docs/course_anchors.py), so the twin page has the same #id. The link is
// rewritten on load and on each move between sections, so a copied or middle-clicked link keeps
// it too.
function courseKeepSection() {
  for (const link of document.querySelectorAll("a.course-language-switch")) {
    link.href = link.href.split("#")[0] + location.hash;
  }
}
document.addEventListener("DOMContentLoaded", courseKeepSection);
window.addEventListener("hashchange", courseKeepSection);
