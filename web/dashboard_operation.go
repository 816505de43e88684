package web

import "github.com/gofiber/fiber/v2"

// operationRoutes registers the operation detail page and its actions (SPEC.md §5).
func (s *Server) operationRoutes(csrfProtect fiber.Handler) {}
