// Sphinx 9.0's Chinese search (html_search_language = "zh") writes
// `window.Stemmer = ChineseStemmer;` into language_data.js but ships only EnglishStemmer (it stems
// the Latin words of Chinese pages in English), so the search page stopped with
// "ChineseStemmer is not defined". This file loads first and names the stemmer it means.
// tests/test_site.py searches for 量化 in a real browser to keep this honest.
// Upstream: sphinx-doc/sphinx#14229, fixed by sphinx-doc/sphinx#14416 (not in Sphinx 9.0.4);
// delete this file, and its line in course_conf.py, with the first release that has the fix.
window.ChineseStemmer = function () {
  return new EnglishStemmer();
};
