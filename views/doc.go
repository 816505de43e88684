// Package views holds the dashboard's templ components. Each exported page takes one props
// struct of display-ready values built by web/; components call no services, read no request
// context, and never bypass templ's escaping, because keys, operation names and receipts come
// from clients and may contain markup.
//
// Regenerate the *_templ.go files with `go tool templ generate` after editing a .templ file.
package views
