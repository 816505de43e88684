package web

import (
	_ "embed"

	"github.com/gofiber/fiber/v2"
)

// openAPIDocument is the OpenAPI 3.1 contract of the JSON API (docs/reference.md §4), hand-written in
// openapi.json. The tests validate every request and response of the API test suite against
// it (openapi_test.go), so it cannot drift from the handlers.
//
//go:embed openapi.json
var openAPIDocument []byte

// handleOpenAPI serves openAPIDocument as it is embedded (GET /openapi.json, no auth).
func handleOpenAPI(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Send(openAPIDocument)
}
