package web

import (
	"github.com/gofiber/fiber/v2"
)

// routes lists every route of the service (SPEC.md §4 and §5).
func (s *Server) routes(metricsGuard, metricsHandler fiber.Handler) {
	app := s.app
	app.Get("/healthz", s.handleHealthz)
	app.Get("/readyz", s.handleReadyz)
	app.Get("/metrics", metricsGuard, metricsHandler)
	app.Get("/openapi.json", handleOpenAPI)

	v1 := app.Group("/v1", identityEncoding, apiAuth(s.auth, s.authFails))
	v1.Post("/acquire", handleAcquire(s.adm))
	v1.Post("/release", handleRelease(s.adm))
	v1.Post("/operations/:id/outcome", handleOutcome(s.adm))
	v1.Get("/operations", handleListOperations(s.reads))
	v1.Get("/operations/:id", handleGetOperation(s.reads))
	v1.Get("/keys", handleListKeys(s.reads))
	v1.Get("/keys/*", handleGetKey(s.reads))
	v1.Get("/attempts", handleListAttempts(s.reads))

	s.dashboardRoutes()
}
