// Plays each <video data-hls="URL"> of a dashboard page: with hls.js (bundled, hls.light.min.js)
// where Media Source Extensions are there, else natively (Safari plays HLS itself).
"use strict";
document.querySelectorAll("video[data-hls]").forEach(function (video) {
  var source = video.getAttribute("data-hls");
  if (window.Hls && window.Hls.isSupported()) {
    var hls = new window.Hls();
    hls.on(window.Hls.Events.ERROR, function (_event, data) {
      if (data.fatal) {
        video.setAttribute("data-hls-error", data.details || data.type);
      }
    });
    hls.loadSource(source);
    hls.attachMedia(video);
  } else if (video.canPlayType("application/vnd.apple.mpegurl")) {
    video.src = source;
  } else {
    video.setAttribute("data-hls-error", "this browser cannot play HLS");
  }
});
