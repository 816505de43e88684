// Package web is idemgate's HTTP layer on Fiber v2: the JSON API of docs/reference.md §4, the
// operational endpoints, and the dashboard of docs/reference.md §5. Handlers are thin: parse, call one
// services method, render. Domain errors become RFC 9457 problem+json (or an HTML page for the
// dashboard) in one place, errors.go.
package web
