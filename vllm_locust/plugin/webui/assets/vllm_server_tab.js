// Puts the "vLLM server" charts (./vllm-server) above the tab's table in Locust's web UI.
// Locust's extension mechanism gives extra tabs a table only; this adds the page beside it.
(function () {
  var KEY = "vllm-server", FRAME = "vllm-server-frame", HEAD = "vLLM figure";
  function place() {
    var open = new URLSearchParams(window.location.search).get("tab") === KEY;
    var frame = document.getElementById(FRAME);
    if (!open) { if (frame) frame.remove(); return; }
    if (frame) return;
    var head = Array.prototype.find.call(document.querySelectorAll("th"), function (th) {
      return th.textContent.trim() === HEAD;
    });
    if (!head) return;
    var container = head.closest("table").parentElement;
    frame = document.createElement("iframe");
    frame.id = FRAME;
    frame.title = "vLLM server charts";
    frame.src = "./vllm-server?embedded=1";
    frame.style.cssText = "width:100%;height:1250px;border:0;display:block;";
    container.parentElement.insertBefore(frame, container);
  }
  window.setInterval(place, 300);
})();
