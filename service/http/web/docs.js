// /docs: Swagger UI over the served document (/openapi.json), from files this server ships.
// No inline script (the page's Content-Security-Policy forbids it) and no validator badge
// (it would call validator.swagger.io).
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
  });
});
