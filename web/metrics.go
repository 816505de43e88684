package web

import (
	"database/sql"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the Prometheus series this package records (exposed at GET /metrics).
type metrics struct {
	acquires *prometheus.CounterVec
	requests *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_acquires_total",
			Help: "Acquire calls answered, by result (admitted, duplicate, conflict).",
		}, []string{"result"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemgate_http_request_duration_seconds",
			Help:    "HTTP request latency in seconds, by route pattern, method and status.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route", "method", "status"}),
	}
	reg.MustRegister(m.acquires, m.requests)
	return m
}

// registerDBStats exports the connection pool statistics of stats under go_sql_*.
func registerDBStats(reg prometheus.Registerer, stats *sql.DB) {
	reg.MustRegister(collectors.NewDBStatsCollector(stats, "idemgate"))
}

// observe records request latency by route pattern (never the raw path: keys would explode
// the label set).
func (m *metrics) observe() fiber.Handler {
	return func(c *fiber.Ctx) error {
		start := time.Now()
		err := c.Next()
		status := c.Response().StatusCode()
		if err != nil {
			if fe, ok := err.(*fiber.Error); ok {
				status = fe.Code
			}
		}
		// Fiber reuses the method buffer after the handler; copy it before it outlives the request.
		m.requests.WithLabelValues(c.Route().Path, utils.CopyString(c.Method()), strconv.Itoa(status)).Observe(time.Since(start).Seconds())
		return err
	}
}
