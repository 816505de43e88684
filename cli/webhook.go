package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/idemgate/idemgate/services"
	"github.com/spf13/cobra"
)

// cliActor is who the audit fields (created_by, deleted_by) name for changes made with the
// command line, which has no account.
const cliActor = "cli"

// webhookCmd is `idemgate webhook create|list|delete|disable|enable` (docs/reference.md §10).
func webhookCmd(env Env) *cobra.Command {
	cmd := &cobra.Command{Use: "webhook", Short: "Manage webhook endpoints (Standard Webhooks, per tenant)"}
	var tenant, url, events string
	create := &cobra.Command{
		Use:   "create --tenant T --url U --events a,b",
		Short: "Create an endpoint; prints only its signing secret (whsec_…) on stdout, this once",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, log, db, err := open(c.Context(), env)
			if err != nil {
				return err
			}
			defer db.Close()
			ep, err := services.NewWebhooks(db, log, cfg.WebhookAllowPrivate).CreateEndpoint(c.Context(), cliActor,
				services.WebhookEndpointInput{Tenant: tenant, URL: url, Events: events})
			if err != nil {
				return describe(err)
			}
			fmt.Fprintf(env.Stderr, "created webhook endpoint %d for tenant %q: %s (%s)\n", ep.Endpoint.ID,
				ep.Endpoint.Tenant, ep.Endpoint.URL, strings.Join(ep.Endpoint.Events, ","))
			fmt.Fprintln(env.Stdout, ep.Secret)
			return nil
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "an existing tenant's name (required)")
	create.Flags().StringVar(&url, "url", "", "https:// URL, or http:// to 127.0.0.1, ::1 or localhost (required)")
	create.Flags().StringVar(&events, "events", "", "comma-separated: "+strings.Join(services.WebhookEventTypes, ", ")+" (required)")
	for _, f := range []string{"tenant", "url", "events"} {
		_ = create.MarkFlagRequired(f)
	}

	var listTenant string
	list := &cobra.Command{
		Use:   "list [--tenant T]",
		Short: "List endpoints (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, log, db, err := open(c.Context(), env)
			if err != nil {
				return err
			}
			defer db.Close()
			eps, err := services.NewWebhooks(db, log, cfg.WebhookAllowPrivate).ListEndpoints(c.Context(), listTenant)
			if err != nil {
				return describe(err)
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTENANT\tSTATUS\tEVENTS\tURL\tCREATED BY\tCREATED (UTC)")
			for _, e := range eps {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.Tenant, e.Status, strings.Join(e.Events, ","),
					e.URL, e.CreatedBy, e.CreatedAt.Format("2006-01-02 15:04:05"))
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&listTenant, "tenant", "", "only this tenant's endpoints")

	byID := func(use, short, done string, fn func(c *cobra.Command, w *services.Webhooks, id int64) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " ID", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(c *cobra.Command, args []string) error {
				id, err := strconv.ParseInt(args[0], 10, 64)
				if err != nil || id < 1 {
					return fmt.Errorf("%q is not an endpoint id (see webhook list)", args[0])
				}
				cfg, log, db, err := open(c.Context(), env)
				if err != nil {
					return err
				}
				defer db.Close()
				if err := fn(c, services.NewWebhooks(db, log, cfg.WebhookAllowPrivate), id); errors.Is(err, services.ErrNotFound) {
					return fmt.Errorf("no webhook endpoint %d (or it was deleted already)", id)
				} else if err != nil {
					return err
				}
				fmt.Fprintf(env.Stdout, "%s webhook endpoint %d\n", done, id)
				return nil
			},
		}
	}
	del := byID("delete", "Delete an endpoint; its pending deliveries end as failed", "deleted",
		func(c *cobra.Command, w *services.Webhooks, id int64) error {
			return w.DeleteEndpoint(c.Context(), cliActor, id)
		})
	disable := byID("disable", "Pause an endpoint: no new events, pending deliveries wait", "disabled",
		func(c *cobra.Command, w *services.Webhooks, id int64) error {
			return w.SetEndpointDisabled(c.Context(), cliActor, id, true)
		})
	enable := byID("enable", "Resume a disabled endpoint", "enabled",
		func(c *cobra.Command, w *services.Webhooks, id int64) error {
			return w.SetEndpointDisabled(c.Context(), cliActor, id, false)
		})
	cmd.AddCommand(create, list, del, disable, enable)
	return cmd
}
