"""`python -m project serve`: the trained classifier behind an HTTP endpoint (LitServe, dynamic batching), with a
page at / to try it in a browser (page.html)."""

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {
    "commands": {"serve": (".server:main", "HTTP prediction endpoint and a page to try it (LitServe)")}
}
