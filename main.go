// Command idemgate is an idempotency-key admission service with a reconciliation dashboard.
// See README.md; running it is docs/operations.md, the contract docs/reference.md.
package main

import (
	"context"
	"os"

	"github.com/idemgate/idemgate/cli"
)

func main() {
	err := cli.Execute(context.Background(), os.Args[1:], cli.Env{
		Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	})
	if err != nil {
		os.Exit(1)
	}
}
