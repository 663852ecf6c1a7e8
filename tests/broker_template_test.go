package tests

import (
	"fmt"
	"slices"
	"testing"

	"github.com/runfleet/runfleet/shared/config"
)

// TestTemplateBrokerParameters: with a broker (BrokerSecretName and
// BrokerKmsKeyArn), the api, stream, sweep and dispatcher functions get
// RUNFLEET_BROKER and RUNFLEET_BROKER_KEY, which Fleet's config accepts;
// the probe gets neither. The roles of those that mint (the api, the sweep,
// and the dispatcher, which mints a waiting run's keys when it offers the
// run to a host) may read the recipes
// and the secrets under BrokerSecretsPath, seal and open with the key only
// under the encryption context "runfleet", and read and update only the
// "#broker#" items of the idempotency table; the stream's may read the
// recipes and open with the key, nothing more. Without BrokerSecretName
// no role is granted any of it, a key given or not.
func TestTemplateBrokerParameters(t *testing.T) {
	s := newIAMStack(t)
	const key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	params := map[string]any{"BrokerSecretName": "broker/recipes", "BrokerKmsKeyArn": key}
	recipes, appKey, other := secretARN(s.prefix+"broker/recipes"), secretARN(s.prefix+"broker/github-app-key"), secretARN(s.prefix+"other")
	idem := tableARN(s.tables.Idempotency)
	for fn := range templateFunctions {
		t.Run(fn, func(t *testing.T) {
			env := functionEnv(t, s.resolver(params), s.tpl, fn)
			minting := fn == "ApiFunction" || fn == "SweepFunction" || fn == "DispatcherFunction"
			brokered := minting || fn == "StreamFunction"
			if want := map[bool]string{true: s.prefix + "broker/recipes"}[brokered]; env[config.EnvBroker] != want {
				t.Errorf("%s = %q, want %q", config.EnvBroker, env[config.EnvBroker], want)
			}
			if want := map[bool]string{true: "kms:" + key}[brokered]; env[config.EnvBrokerKey] != want {
				t.Errorf("%s = %q, want %q", config.EnvBrokerKey, env[config.EnvBrokerKey], want)
			}
			env[config.EnvStore] = config.StoreDynamoDB
			if _, err := config.FromEnv(func(k string) string { return env[k] }); err != nil {
				t.Errorf("Fleet refuses the environment: %v", err)
			}

			stmts, _ := deployedRole(t, s.tpl, s.resolver(params), fn)
			bySid := map[string]statement{}
			for _, st := range stmts {
				bySid[st.Sid] = st
			}
			allowed := func(c awsCall) bool {
				return slices.ContainsFunc(stmts, func(st statement) bool { return st.allows(c) })
			}
			for c, want := range map[awsCall]bool{
				{"secretsmanager:GetSecretValue", recipes}: brokered,
				{"secretsmanager:GetSecretValue", appKey}:  minting,
				{"secretsmanager:GetSecretValue", other}:   false,
				{"kms:Decrypt", key}:                       brokered,
				{"kms:Encrypt", key}:                       minting,
				{"dynamodb:UpdateItem", idem}:              minting,
			} {
				if allowed(c) != want {
					t.Errorf("%s allowed: %v, want %v", c, allowed(c), want)
				}
			}
			if k, ok := bySid["BrokerKey"]; brokered && (!ok || fmt.Sprint(k.Condition) != "map[StringLike:map[kms:EncryptionContext:runfleet:*]]") {
				t.Errorf("the broker key's statement %+v: want it conditioned on the encryption context runfleet", k)
			}
			if st, ok := bySid["BrokerStates"]; minting != ok ||
				ok && (fmt.Sprint(st.Action) != "[dynamodb:GetItem dynamodb:UpdateItem]" ||
					fmt.Sprint(st.Condition) != "map[ForAllValues:StringLike:map[dynamodb:LeadingKeys:[#broker#*]]]") {
				t.Errorf("broker states statement %+v (present %v): want GetItem and UpdateItem on #broker# items only, for the api, sweep and dispatcher", st, ok)
			}
		})
	}

	// A key without recipes grants nothing and sets nothing.
	keyOnly := s.resolver(map[string]any{"BrokerKmsKeyArn": key})
	for fn := range templateFunctions {
		stmts, _ := deployedRole(t, s.tpl, keyOnly, fn)
		for _, st := range stmts {
			if st.Sid == "BrokerKey" || st.Sid == "BrokerSecrets" || st.Sid == "BrokerStates" {
				t.Errorf("%s without BrokerSecretName has %+v", fn, st)
			}
		}
		if env := functionEnv(t, keyOnly, s.tpl, fn); env[config.EnvBroker] != "" || env[config.EnvBrokerKey] != "" {
			t.Errorf("%s without BrokerSecretName has the broker's variables: %v", fn, env)
		}
	}
}
