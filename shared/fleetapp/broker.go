package fleetapp

import (
	"context"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/kms"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/emf"
	"github.com/runfleet/runfleet/shared/fleet"
)

// openBroker builds the broker of RUNFLEET_BROKER (the recipes, the reader
// of their secret references) and RUNFLEET_BROKER_KEY (the sealer), on
// the opened store (the oauth2 recipes' shared state): deps.Broker when a
// test injects one, nil when none is configured. AWS is loaded only for
// what names it: a Secrets Manager document or reference, a KMS key. A bad
// recipe, a missing key for recipes or an unreadable document fails the
// start, naming the variable and the field.
func (a *App) openBroker(ctx context.Context, cfg config.Fleet, deps Deps, clients *awsClients, metrics *emf.Writer) (fleet.Broker, error) {
	if deps.Broker != nil {
		return deps.Broker, nil
	}
	if cfg.Broker == "" {
		return nil, nil
	}
	secretsCfg := broker.SecretsConfig{Clock: deps.Clock}
	if !strings.HasPrefix(cfg.Broker, "file:") {
		sm, err := clients.secretsManager()
		if err != nil {
			return nil, err
		}
		secretsCfg.SecretsManager = sm
	}
	recipes, secrets, err := broker.Load(ctx, cfg.Broker, secretsCfg)
	if err != nil {
		return nil, err
	}
	if secretsCfg.SecretsManager == nil && slices.ContainsFunc(secretRefs(recipes), func(ref string) bool { return !strings.HasPrefix(ref, "file:") }) {
		// A file of recipes whose secrets are in Secrets Manager.
		if secretsCfg.SecretsManager, err = clients.secretsManager(); err != nil {
			return nil, err
		}
		if recipes, secrets, err = broker.Load(ctx, cfg.Broker, secretsCfg); err != nil {
			return nil, err
		}
	}
	if len(recipes) == 0 {
		return nil, nil
	}
	var sealer broker.Sealer
	if cfg.BrokerKey != "" {
		opts := broker.SealerOptions{Random: deps.Random}
		if strings.HasPrefix(cfg.BrokerKey, "kms:") {
			ac, err := clients.config()
			if err != nil {
				return nil, err
			}
			opts.KMS = kms.NewFromConfig(ac)
		}
		if sealer, err = broker.OpenSealer(cfg.BrokerKey, opts); err != nil {
			return nil, err
		}
	}
	return newBroker(recipes, broker.Deps{
		Secrets: secrets, Sealer: sealer, States: a.Store, Clock: deps.Clock, HTTPClient: deps.BrokerHTTP,
		Logger: deps.Logger, Random: deps.Random, OnEvent: fleet.BrokerMetrics(metrics, orReal(deps.Clock), deps.Logger),
	})
}

// secretRefs are every secret reference of recipes.
func secretRefs(recipes map[string]broker.Recipe) []string {
	var refs []string
	for _, r := range recipes {
		if g := r.GitHubApp; g != nil {
			refs = append(refs, g.PrivateKeySecret)
		}
		if o := r.OAuth2; o != nil {
			refs = append(refs, o.ClientSecretSecret, o.RefreshTokenSecret)
		}
	}
	return refs
}

var _ fleet.Broker = (*broker.Broker)(nil)

// newBroker is broker.New, as the fleet.Broker Fleet uses.
func newBroker(recipes map[string]broker.Recipe, d broker.Deps) (fleet.Broker, error) {
	b, err := broker.New(recipes, d)
	if err != nil {
		return nil, err
	}
	return b, nil
}
