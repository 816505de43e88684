package web

import "github.com/gofiber/fiber/v2"

// overviewRoutes registers the Overview page (SPEC.md §5).
func (s *Server) overviewRoutes(csrfProtect fiber.Handler) {
	s.app.Get("/", pageHeaders, s.requireOperator, func(c *fiber.Ctx) error { return c.Redirect("/keys", fiber.StatusSeeOther) })
}
