// The lessons' quizzes (jupyterquiz) are drawn by scripts in the notebook outputs, after
// MathJax has looked at the page: typeset any maths in them once the page has loaded.
window.addEventListener("load", function () {
  var quizzes = Array.from(document.querySelectorAll(".Quiz"));
  if (!quizzes.length || !window.MathJax || !window.MathJax.typesetPromise) return;
  quizzes.forEach(function (q) { q.classList.add("mathjax_process"); });
  window.MathJax.typesetPromise(quizzes);
});
