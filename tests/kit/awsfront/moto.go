package awsfront

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// The IAM names the bootstrap creates.
const (
	// RealUserName holds the real credentials: what edge keeps and signs
	// with, allowed everything.
	RealUserName = "runfleet-real"
	// EdgeUserName is edge's own identity for STS: it may only assume
	// RoleName.
	EdgeUserName = "runfleet-edge"
	// RoleName trusts EdgeUserName and is allowed everything.
	RoleName = "runfleet-task"

	allowAllPolicyName = "runfleet-allow-all"
	assumePolicyName   = "runfleet-assume-task"
)

// Identity is what the bootstrap created in moto's account.
type Identity struct {
	// AccountID is moto's account, 123456789012 unless MOTO_ACCOUNT_ID
	// says otherwise.
	AccountID string
	// Real is the access key of RealUserName: the real credentials edge
	// holds. Its secret never goes to a task.
	Real        aws.Credentials
	RealUserARN string
	// Edge is the access key of EdgeUserName, edge's identity for
	// sts:AssumeRole.
	Edge        aws.Credentials
	EdgeUserARN string
	// RoleARN is arn:aws:iam::<account>:role/runfleet-task.
	RoleARN string
}

// bootstrap is one IAM call made before moto starts checking signatures.
type bootstrap func(ctx context.Context, c *iam.Client, id *Identity) error

const allowAll = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}`

// bootstrapSteps are the calls moto serves unauthenticated: moto counts
// every action until INITIAL_NO_AUTH_ACTION_COUNT and checks signatures
// from then on, so the budget is exactly len(bootstrapSteps) and a step
// added here moves it with it.
var bootstrapSteps = []bootstrap{
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		_, err := c.CreatePolicy(ctx, &iam.CreatePolicyInput{PolicyName: aws.String(allowAllPolicyName), PolicyDocument: aws.String(allowAll)})
		return err
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		out, err := c.CreateUser(ctx, &iam.CreateUserInput{UserName: aws.String(RealUserName)})
		if err != nil {
			return err
		}
		id.RealUserARN = aws.ToString(out.User.Arn)
		id.AccountID, err = accountOf(id.RealUserARN)
		return err
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		_, err := c.AttachUserPolicy(ctx, &iam.AttachUserPolicyInput{UserName: aws.String(RealUserName), PolicyArn: aws.String(policyARN(id, allowAllPolicyName))})
		return err
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		out, err := c.CreateAccessKey(ctx, &iam.CreateAccessKeyInput{UserName: aws.String(RealUserName)})
		if err != nil {
			return err
		}
		id.Real = aws.Credentials{AccessKeyID: aws.ToString(out.AccessKey.AccessKeyId), SecretAccessKey: aws.ToString(out.AccessKey.SecretAccessKey), Source: "awsfront real"}
		return nil
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		id.RoleARN = "arn:aws:iam::" + id.AccountID + ":role/" + RoleName
		doc := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"sts:AssumeRole","Resource":"` + id.RoleARN + `"}]}`
		_, err := c.CreatePolicy(ctx, &iam.CreatePolicyInput{PolicyName: aws.String(assumePolicyName), PolicyDocument: aws.String(doc)})
		return err
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		out, err := c.CreateUser(ctx, &iam.CreateUserInput{UserName: aws.String(EdgeUserName)})
		if err != nil {
			return err
		}
		id.EdgeUserARN = aws.ToString(out.User.Arn)
		return nil
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		_, err := c.AttachUserPolicy(ctx, &iam.AttachUserPolicyInput{UserName: aws.String(EdgeUserName), PolicyArn: aws.String(policyARN(id, assumePolicyName))})
		return err
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		out, err := c.CreateAccessKey(ctx, &iam.CreateAccessKeyInput{UserName: aws.String(EdgeUserName)})
		if err != nil {
			return err
		}
		id.Edge = aws.Credentials{AccessKeyID: aws.ToString(out.AccessKey.AccessKeyId), SecretAccessKey: aws.ToString(out.AccessKey.SecretAccessKey), Source: "awsfront edge"}
		return nil
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		trust := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"` + id.EdgeUserARN + `"},"Action":"sts:AssumeRole"}]}`
		_, err := c.CreateRole(ctx, &iam.CreateRoleInput{RoleName: aws.String(RoleName), AssumeRolePolicyDocument: aws.String(trust)})
		return err
	},
	func(ctx context.Context, c *iam.Client, id *Identity) error {
		// Temporary credentials of the role act with the role's policies
		// (moto's AssumedRoleAccessKey.collect_policies).
		_, err := c.AttachRolePolicy(ctx, &iam.AttachRolePolicyInput{RoleName: aws.String(RoleName), PolicyArn: aws.String(policyARN(id, allowAllPolicyName))})
		return err
	},
}

func policyARN(id *Identity, name string) string {
	return "arn:aws:iam::" + id.AccountID + ":policy/" + name
}

// accountOf reads the account out of arn:aws:iam::<account>:user/<name>.
func accountOf(arn string) (string, error) {
	parts := strings.Split(arn, ":")
	if len(parts) < 6 || parts[4] == "" {
		return "", fmt.Errorf("awsfront: no account in ARN %q", arn)
	}
	return parts[4], nil
}

// StartMoto starts a moto_server of its own that checks SigV4 signatures
// once the IAM bootstrap is done, and returns it with what the bootstrap
// created. The server must not be shared with tests that expect moto to
// accept anything, nor be Reset (that would drop the users and keys).
// The caller stops it.
func StartMoto(ctx context.Context) (*motoserver.Server, Identity, error) {
	budget := "INITIAL_NO_AUTH_ACTION_COUNT=" + strconv.Itoa(len(bootstrapSteps))
	moto, err := motoserver.StartWith(ctx, motoserver.Options{Env: []string{budget}})
	if err != nil {
		return nil, Identity{}, err
	}
	id, err := bootstrapIAM(ctx, moto)
	if err != nil {
		return nil, Identity{}, errors.Join(err, moto.Stop())
	}
	return moto, id, nil
}

func bootstrapIAM(ctx context.Context, moto *motoserver.Server) (Identity, error) {
	var id Identity
	// Any credentials do for the bootstrap: moto checks none yet.
	c := iam.NewFromConfig(moto.AWSConfig())
	for i, step := range bootstrapSteps {
		if err := step(ctx, c, &id); err != nil {
			return id, fmt.Errorf("awsfront: IAM bootstrap step %d of %d: %w", i+1, len(bootstrapSteps), err)
		}
	}
	// The budget is spent exactly when moto counts as this package
	// assumes. If it counted fewer calls, this wrong secret would be let
	// through (and spend one more): refuse to hand out a moto that does
	// not check.
	wrong := id.Real
	wrong.SecretAccessKey = "not-" + wrong.SecretAccessKey
	if err := callerIdentity(ctx, moto, wrong); err == nil {
		return id, errors.New("awsfront: moto accepted a wrong secret after the bootstrap: its signature checks are not on")
	}
	if err := callerIdentity(ctx, moto, id.Real); err != nil {
		return id, fmt.Errorf("awsfront: moto refused the real key after the bootstrap: %w", err)
	}
	return id, nil
}

func callerIdentity(ctx context.Context, moto *motoserver.Server, c aws.Credentials) error {
	cfg := moto.AWSConfig()
	cfg.Credentials = credentials.StaticCredentialsProvider{Value: c}
	_, err := sts.NewFromConfig(cfg).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	return err
}
