// sphinx-copybutton speaks zh-CN but not zh-TW: its copybutton.js picks its tooltips from
// `messages` by <html lang>, and zh_TW pages are lang="zh-TW". This file, loaded on zh_TW pages
// right after copybutton.js and before it adds the buttons (when the page is ready), adds the
// Traditional Chinese texts and switches to them, the icons' titles too.
// tests/test_zh_chrome.py hovers and clicks a button in Chromium to keep this honest.
if (typeof messages !== "undefined" && document.documentElement.lang === "zh-TW") {
  messages["zh-TW"] = {
    copy: "複製",
    copy_to_clipboard: "複製到剪貼簿",
    copy_success: "已複製！",
    copy_failure: "複製失敗",
  };
  for (const key of ["copy_success", "copy_to_clipboard"]) {
    const english = `<title>${messages[locale][key]}</title>`;
    const chinese = `<title>${messages["zh-TW"][key]}</title>`;
    iconCheck = iconCheck.replace(english, chinese);
    iconCopy = iconCopy.replace(english, chinese);
  }
  locale = "zh-TW";
}
