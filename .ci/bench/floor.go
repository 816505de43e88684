//go:build ignore

// The floor server for make bench (.ci/bench/compare.sh builds it with
// `go build .ci/bench/floor.go`; the build tag keeps it out of ./... and out of the binary).
//
// It answers POST /v1/acquire in idemgate's request shape with the least work a durable acquire
// that records every attempt can do on this machine: Fiber, a pgx pool, and ONE statement that
// upserts the hold (taking over only an expired one) and appends an attempt row in the same
// round trip. No authentication, validation, fencing tokens, operations or events. Its rate is
// the practical ceiling for idemgate's acquire on the same hardware, so make bench reports
// idemgate's rate as a ratio to it, measured in the same run: ratios travel between noisy
// machines, absolute numbers do not.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// schema is made at start; compare.sh gives the floor a database of its own.
const schema = `
CREATE TABLE IF NOT EXISTS floor_holds (
  scope      text        NOT NULL,
  key        text        NOT NULL,
  owner      uuid        NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (scope, key)
);
CREATE TABLE IF NOT EXISTS floor_attempts (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  scope        text        NOT NULL,
  key          text        NOT NULL,
  attempted_at timestamptz NOT NULL,
  admitted     boolean     NOT NULL,
  owner        uuid
)`

// acquire takes a free or expired key and logs the attempt, in one statement. A live hold makes
// the upsert return no row (ON CONFLICT ... WHERE false), which the attempt row records as not
// admitted.
const acquire = `WITH taken AS (
  INSERT INTO floor_holds (scope, key, owner, expires_at)
  VALUES ($1, $2, gen_random_uuid(), now() + make_interval(secs => $3))
  ON CONFLICT (scope, key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
   WHERE floor_holds.expires_at <= now()
  RETURNING owner
)
INSERT INTO floor_attempts (scope, key, attempted_at, admitted, owner)
SELECT $1, $2, now(), EXISTS (SELECT 1 FROM taken), (SELECT owner FROM taken)
RETURNING admitted, owner`

type request struct {
	Key        string `json:"key"`
	TTLSeconds int    `json:"ttl_seconds"`
}

type answer struct {
	Admitted bool   `json:"admitted"`
	Owner    string `json:"owner_token,omitempty"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/idemgate_floor?sslmode=disable", "PostgreSQL URL")
	conns := flag.Int("pool", 16, "database connections (idemgate's default IDEMGATE_DB_MAX_CONNS)")
	flag.Parse()
	ctx := context.Background()

	cfg, err := pgxpool.ParseConfig(*dsn)
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = int32(*conns), int32(*conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, schema); err != nil {
		log.Fatal(err)
	}

	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/v1/acquire", func(c *fiber.Ctx) error {
		var r request
		if err := json.Unmarshal(c.Body(), &r); err != nil || r.Key == "" {
			return c.SendStatus(fiber.StatusBadRequest)
		}
		if r.TTLSeconds <= 0 {
			r.TTLSeconds = 3600
		}
		// One scope per bearer token, as idemgate scopes keys by the API key's tenant.
		var admitted bool
		var owner uuid.NullUUID
		err := pool.QueryRow(c.UserContext(), acquire, c.Get("Authorization"), r.Key, r.TTLSeconds).Scan(&admitted, &owner)
		if err != nil {
			return err
		}
		if !admitted {
			return c.Status(fiber.StatusOK).JSON(answer{})
		}
		return c.Status(fiber.StatusCreated).JSON(answer{Admitted: true, Owner: owner.UUID.String()})
	})
	app.Get("/healthz", func(c *fiber.Ctx) error { return c.SendString("ok") })

	go func() {
		s := make(chan os.Signal, 1)
		signal.Notify(s, syscall.SIGINT, syscall.SIGTERM)
		<-s
		_ = app.ShutdownWithTimeout(2 * time.Second)
	}()
	if err := app.Listen(*addr); err != nil {
		log.Fatal(err)
	}
}
