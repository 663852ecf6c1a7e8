package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/awsfront"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// The AWS tests run Debian's AWS CLI, boto3 and curl as the task user with
// nothing but the task's env (placeholder credentials, HTTPS_PROXY,
// AWS_CA_BUNDLE) and a region in the task's own ~/.aws/config: no endpoint
// flag, no credential of the test's. They call the real AWS names, which
// edge's proxy.upstream.resolve pins to an awsfront front (its own moto,
// checking signatures with the real key): what reaches moto is what edge
// signed again, and the front's Records say with which key id and payload
// mode.

// The buckets and the table the tasks use. awsOtherBucket's virtual host
// resolves to the front but is in no key's domains.
const (
	awsCLIBucket   = "runfleet-cli"
	awsBotoBucket  = "runfleet-boto3"
	awsOtherBucket = "runfleet-other"
	awsTable       = "runfleet-e2e"
)

// awsVhosts are the virtual hosts of buckets, global and regional.
func awsVhosts(buckets ...string) []string {
	var names []string
	for _, b := range buckets {
		names = append(names, b+".s3.amazonaws.com", b+".s3.us-east-1.amazonaws.com")
	}
	return names
}

// awsMainDomains are AWS_MAIN's domains, which its tasks declare whole.
var awsMainDomains = append([]string{
	"sts.us-east-1.amazonaws.com", "sts.amazonaws.com", "s3.amazonaws.com", "s3.us-east-1.amazonaws.com",
	"dynamodb.us-east-1.amazonaws.com", "iam.amazonaws.com",
}, awsVhosts(awsCLIBucket, awsBotoBucket)...)

// startAWSFront starts a front (and its moto) for one test on port 443 of
// a loopback address nothing listens on: edge dials a pinned AWS name on
// the port its client asked for, 443. Root may bind it.
func startAWSFront(t *testing.T) *awsfront.Front {
	t.Helper()
	for i := 1; i < 64; i++ {
		addr := fmt.Sprintf("127.28.%d.1:443", i)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		return awsfront.StartT(t, awsfront.Config{Addr: addr, Names: []string{"iam.amazonaws.com"}})
	}
	t.Fatal("no free 127.28.x.1:443 for the AWS front")
	return nil
}

// writeAWSConfig writes the fixture's edge.json for the AWS tests: the
// AWS names pinned to the front, whose CA edge trusts upstream, egress
// open, and three aws keys: AWS_MAIN (the real key, from the secrets
// file), AWS_ROLE (a session of the front's role, assumed with edge's own
// identity) and AWS_NOROLE (a role edge may not assume).
func writeAWSConfig(f *fixture, front *awsfront.Front) {
	f.t.Helper()
	id := front.Identity
	b, err := json.Marshal(map[string]string{
		"acme/AWS_MAIN": fmt.Sprintf(`{"accessKeyId": %q, "secretAccessKey": %q}`, id.Real.AccessKeyID, id.Real.SecretAccessKey),
	})
	must(f.t, err)
	must(f.t, os.WriteFile(f.secretsPath, b, 0o600))
	scope := func(services ...string) map[string]any {
		return map[string]any{"regions": []string{"us-east-1"}, "services": services}
	}
	role := func(arn string) map[string]any {
		s := scope("sts")
		s["assumeRole"] = map[string]any{"roleArn": arn}
		return s
	}
	sts := []string{"sts.us-east-1.amazonaws.com"}
	cfg := map[string]any{
		"dataDir": f.dataDir,
		"api":     map[string]any{"listen": "127.0.0.1:0", "tokenFile": f.tokenPath},
		"proxy": map[string]any{"listen": "127.0.0.1:0", "egress": "open", "upstream": map[string]any{
			"resolve":        front.Resolve(awsVhosts(awsCLIBucket, awsBotoBucket, awsOtherBucket)...),
			"allowPrivate":   []string{"127.0.0.0/8"},
			"extraRootsFile": front.CAFile,
		}},
		"ca": map[string]any{},
		"policy": map[string]any{"projects": map[string]any{"acme": map[string]any{"keys": map[string]any{
			"AWS_MAIN":   map[string]any{"kind": "aws", "domains": awsMainDomains, "aws": scope("sts", "s3", "dynamodb", "iam")},
			"AWS_ROLE":   map[string]any{"kind": "aws", "domains": sts, "aws": role(id.RoleARN)},
			"AWS_NOROLE": map[string]any{"kind": "aws", "domains": sts, "aws": role("arn:aws:iam::" + id.AccountID + ":role/runfleet-missing")},
		}}}},
		"secrets": map[string]any{"file": f.secretsPath},
		"agents":  map[string]any{"shell": map[string]any{"argv": []string{"sh", "-c", "{prompt}"}}},
		"runner":  map[string]any{"user": "nobody", "cancelGrace": "10s"},
	}
	b, err = json.MarshalIndent(cfg, "", "  ")
	must(f.t, err)
	f.cfgPath = filepath.Join(f.dir, "edge.json")
	must(f.t, os.WriteFile(f.cfgPath, b, 0o600))
}

// openAWSHost opens a host on the AWS edge.json with the clock c (nil: the
// real one), edge's own AWS configuration (for AssumeRole) being the
// front's edge identity, reaching the front.
func openAWSHost(f *fixture, front *awsfront.Front, c clock.Clock) *edgeHost {
	f.t.Helper()
	writeAWSConfig(f, front)
	cfg, err := config.Load(f.cfgPath)
	must(f.t, err)
	logs := &syncbuf.Buffer{}
	h, err := Open(context.Background(), Options{
		Config: cfg, Clock: c, SystemRootsFile: f.systemRoots,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		AWS: func(context.Context) (aws.Config, error) {
			return front.AWSConfig(credentials.StaticCredentialsProvider{Value: front.Identity.Edge}), nil
		},
	})
	must(f.t, err)
	h.Start(nil)
	client, err := hostproto.NewClient(hostproto.ClientConfig{BaseURL: "http://" + h.APIAddr().String(), Token: hostToken})
	must(f.t, err)
	e := &edgeHost{Host: h, f: f, client: client, logs: logs}
	f.t.Cleanup(func() { e.shutdown() })
	return e
}

// skewedClock is the real clock set off by offset.
type skewedClock struct {
	clock.Real
	offset time.Duration
}

func (c skewedClock) Now() time.Time { return time.Now().Add(c.offset) }

// awsSecrets declares key for every domain the policy gives it.
func awsSecrets(key string) []runspec.Secret {
	domains := awsMainDomains
	if key != "AWS_MAIN" {
		domains = []string{"sts.us-east-1.amazonaws.com"}
	}
	return []runspec.Secret{{ProjectID: "acme", Key: key, Domains: domains}}
}

// awsStep is one command of an AWS task, a shell script (run with sh -e);
// its section of the output is named name (clientSections reads it).
type awsStep struct{ name, script string }

// awsPrompt is an AWS task's prompt: the task's ~/.aws/config (a region,
// no pager) and ~/.aws/config-signed (the same, and botocore signs S3
// payloads: a --profile would not do, botocore then ignores the
// credentials in the env), its access key id on a line "akid=", then each
// step as a script of its own, in order or all at once, each bounded by a
// timeout, its output printed between "== NAME exit CODE" and "== end
// NAME".
func awsPrompt(parallel bool, steps ...awsStep) string {
	var b strings.Builder
	b.WriteString(`mkdir -p "$HOME/.aws"
cat >"$HOME/.aws/config" <<'EOF'
[default]
region = us-east-1
cli_pager =
EOF
cat >"$HOME/.aws/config-signed" <<'EOF'
[default]
region = us-east-1
cli_pager =
s3 =
  payload_signing_enabled = true
EOF
echo "akid=$AWS_ACCESS_KEY_ID"
out=$(mktemp -d)
`)
	for _, s := range steps {
		fmt.Fprintf(&b, "cat >\"$out/%[1]s.sh\" <<'STEP'\n%[2]s\nSTEP\n", s.name, s.script)
		run := fmt.Sprintf("(timeout 90 sh -e \"$out/%[1]s.sh\" >\"$out/%[1]s\" 2>&1; echo $? >\"$out/%[1]s.rc\")", s.name)
		if parallel {
			run += " &"
		}
		b.WriteString(run + "\n")
	}
	b.WriteString("wait\n")
	for _, s := range steps {
		fmt.Fprintf(&b, "echo \"== %[1]s exit $(cat \"$out/%[1]s.rc\")\"; cat \"$out/%[1]s\"; echo; echo \"== end %[1]s\"\n", s.name)
	}
	return b.String()
}

// awsRun is an AWS task's run, ended.
type awsRun struct {
	stepsRun
	host *edgeHost
	akid string // the task's placeholder access key id
}

// awsRuns starts AWS tasks and keeps every run, for the leak checks.
type awsRuns struct {
	mu   sync.Mutex
	runs []awsRun
}

// run runs an AWS task declaring key to its end (within d).
func (a *awsRuns) run(t *testing.T, e *edgeHost, key string, d time.Duration, prompt string) awsRun {
	t.Helper()
	run := e.start(runspec.Request{Prompt: prompt, Secrets: awsSecrets(key)})
	var end hostproto.Run
	await.Cond(t, d, "run "+run.RunID+" to end", func() bool {
		var err error
		end, err = e.client.Get(bg, run.RunID)
		must(t, err)
		return hostproto.TerminalStatus(end.Status)
	})
	out := strings.ReplaceAll(e.output(run.RunID), "\r\n", "\n")
	r := awsRun{stepsRun: newStepsRun(run.RunID, out), host: e, akid: envLine(out, "akid")}
	a.mu.Lock()
	a.runs = append(a.runs, r)
	a.mu.Unlock()
	if !strings.HasPrefix(r.akid, "AKIA") && !strings.HasPrefix(r.akid, "ASIA") {
		t.Fatalf("run %s: the task's AWS_ACCESS_KEY_ID is %q, want a placeholder; %+v\n%s", r.id, r.akid, end, out)
	}
	return r
}

// all is every run so far.
func (a *awsRuns) all() []awsRun {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.runs)
}

// lineValue is the value after "name=" on a line of text.
func lineValue(t *testing.T, text, name string) string {
	t.Helper()
	v := envLine(text, name)
	if v == "" {
		t.Errorf("no %s= in:\n%s", name, text)
	}
	return v
}

// awsAudit waits for the audit to hold at least n lines of run's with
// action, and returns all its lines.
func awsAudit(t *testing.T, f *fixture, runID string, action audit.Action, n int) []audit.Entry {
	t.Helper()
	var lines []audit.Entry
	await.Cond(t, 10*time.Second, fmt.Sprintf("%d %s audit lines of %s", n, action, runID), func() bool {
		lines = auditLines(t, f, runID)
		got := 0
		for _, l := range lines {
			if l.Action == action {
				got++
			}
		}
		return got >= n
	})
	return lines
}

// payloadMode names how a record's request carried its payload: its
// x-amz-content-sha256 ("literal" for a digest), "presigned", or "none
// (body hashed)" for a request without the header (signed over the body's
// hash, as STS, IAM and DynamoDB requests are).
func payloadMode(r awsfront.Record) string {
	switch {
	case r.Auth == awsfront.AuthPresigned:
		return "presigned"
	case r.Payload == "":
		return "none (body hashed)"
	case len(r.Payload) == 64 && !strings.HasPrefix(r.Payload, "STREAMING-"):
		return "literal"
	}
	return r.Payload
}

// awsOperation names a record's operation, roughly: S3's by method and
// query, the others' by service.
func awsOperation(r awsfront.Record) string {
	service, _, _ := strings.Cut(r.Host, ".")
	if !strings.Contains(r.Host, ".s3.") && service != "s3" {
		return service
	}
	has := func(p string) bool { return strings.Contains("&"+r.RawQuery, "&"+p) }
	switch {
	case r.Method == "PUT" && has("partNumber=") && has("uploadId="):
		return "UploadPart"
	case r.Method == "POST" && has("uploads"):
		return "CreateMultipartUpload"
	case r.Method == "POST" && has("uploadId="):
		return "CompleteMultipartUpload"
	case r.Method == "PUT" && r.Path == "/":
		return "CreateBucket"
	case r.Method == "PUT":
		return "PutObject"
	case r.Method == "GET" && r.Path == "/":
		return "ListObjects"
	case r.Method == "GET":
		return "GetObject"
	case r.Method == "HEAD":
		return "HeadObject"
	}
	return r.Method
}

// awsS3CLIScript: the CLI makes the bucket, copies 64 MiB up (multipart)
// and down, streams 20 MiB up from stdin and back to stdout, uploads with
// a CRC32 checksum (s3api put-object: aws-chunked with a trailer; s3 cp
// of CLI 2.9 has no --checksum-algorithm) and, with config-signed, with
// botocore signing the payload, and presigns a URL curl downloads;
// printing the sha256 of what went up and came down.
const awsS3CLIScript = `aws s3 mb s3://` + awsCLIBucket + `
head -c 67108864 /dev/urandom >"$TMPDIR/big"
echo "up=$(sha256sum <"$TMPDIR/big" | cut -d' ' -f1)"
aws s3 cp --no-progress "$TMPDIR/big" s3://` + awsCLIBucket + `/cli/big
aws s3 cp --no-progress s3://` + awsCLIBucket + `/cli/big "$TMPDIR/down"
echo "down=$(sha256sum <"$TMPDIR/down" | cut -d' ' -f1)"
rm "$TMPDIR/big" "$TMPDIR/down"
head -c 20971520 /dev/urandom | tee "$TMPDIR/stream" | aws s3 cp - s3://` + awsCLIBucket + `/cli/streamed
echo "streamup=$(sha256sum <"$TMPDIR/stream" | cut -d' ' -f1)"
echo "streamdown=$(aws s3 cp s3://` + awsCLIBucket + `/cli/streamed - | sha256sum | cut -d' ' -f1)"
rm "$TMPDIR/stream"
head -c 300000 /dev/urandom >"$TMPDIR/small"
echo "small=$(sha256sum <"$TMPDIR/small" | cut -d' ' -f1)"
aws s3api put-object --checksum-algorithm CRC32 --body "$TMPDIR/small" --bucket ` + awsCLIBucket + ` --key checksum/small >/dev/null
echo "checksum=$(aws s3 cp s3://` + awsCLIBucket + `/checksum/small - | sha256sum | cut -d' ' -f1)"
AWS_CONFIG_FILE="$HOME/.aws/config-signed" aws s3 cp --no-progress "$TMPDIR/small" s3://` + awsCLIBucket + `/signed/small
echo "signed=$(AWS_CONFIG_FILE="$HOME/.aws/config-signed" aws s3 cp s3://` + awsCLIBucket + `/signed/small - | sha256sum | cut -d' ' -f1)"
url=$(aws s3 presign s3://` + awsCLIBucket + `/signed/small --expires-in 300)
echo "presigned=$(curl -sS --fail "$url" | sha256sum | cut -d' ' -f1)"
rm "$TMPDIR/small"`

// awsBotoPipeScript: boto3 uploads 20 MiB from a pipe (a stream that
// cannot seek, read as it comes) with upload_fileobj, downloads it, and
// puts and gets an object with a CRC32 checksum (aws-chunked, trailer).
const awsBotoPipeScript = `/usr/bin/python3 - <<'EOF'
import hashlib, io, subprocess
import boto3
s3 = boto3.client("s3")
s3.create_bucket(Bucket="` + awsBotoBucket + `")
class Pipe:
    """A stream that cannot seek: it reads a pipe and hashes what it hands out."""
    def __init__(self, f):
        self.f, self.h, self.n = f, hashlib.sha256(), 0
    def read(self, size=-1):
        b = self.f.read(size)
        self.h.update(b)
        self.n += len(b)
        return b
src = subprocess.Popen(["head", "-c", "20971520", "/dev/urandom"], stdout=subprocess.PIPE)
up = Pipe(src.stdout)
s3.upload_fileobj(up, "` + awsBotoBucket + `", "boto3/piped")
src.wait()
print("up=%d:%s" % (up.n, up.h.hexdigest()))
buf = io.BytesIO()
s3.download_fileobj("` + awsBotoBucket + `", "boto3/piped", buf)
print("down=%d:%s" % (len(buf.getvalue()), hashlib.sha256(buf.getvalue()).hexdigest()))
body = b"x" * 300000
s3.put_object(Bucket="` + awsBotoBucket + `", Key="boto3/checksum", Body=body, ChecksumAlgorithm="CRC32")
got = s3.get_object(Bucket="` + awsBotoBucket + `", Key="boto3/checksum")["Body"].read()
print("checksum=%s" % (got == body))
EOF`

// awsDynamoScript: the CLI makes a table, puts an item and gets it back,
// then an item of 200,000 characters (a request body past the proxy's
// 64 KiB body buffer: spooled to check its hash).
const awsDynamoScript = `aws dynamodb create-table --table-name ` + awsTable + ` --attribute-definitions AttributeName=id,AttributeType=S \
  --key-schema AttributeName=id,KeyType=HASH --billing-mode PAY_PER_REQUEST --output text --query TableDescription.TableName
aws dynamodb put-item --table-name ` + awsTable + ` --item '{"id": {"S": "k1"}, "v": {"S": "through edge"}}'
echo "got=$(aws dynamodb get-item --table-name ` + awsTable + ` --key '{"id": {"S": "k1"}}' --output text --query Item.v.S)"
printf '{"id": {"S": "big"}, "v": {"S": "%s"}}' "$(head -c 200000 /dev/zero | tr '\0' x)" >"$TMPDIR/item.json"
aws dynamodb put-item --table-name ` + awsTable + ` --item "file://$TMPDIR/item.json"
rm "$TMPDIR/item.json"
echo "big=$(aws dynamodb get-item --table-name ` + awsTable + ` --key '{"id": {"S": "big"}}' --output text --query 'length(Item.v.S)')"`

// awsCallerIdentity prints the caller's ARN.
const awsCallerIdentity = "aws sts get-caller-identity --output text --query Arn"

// Real clients through edge with placeholder credentials: the AWS CLI
// (STS through the explicit and the transparent proxy, S3 up and down,
// multipart and streamed, presigning, DynamoDB, IAM), boto3 (a pipe's
// upload) and curl (the presigned URL) reach moto signed with the real
// key, never the placeholder, and an AssumeRole session per run; the
// same clients refused, each request audited blocked for its reason and
// never forwarded; and nothing of the real credentials anywhere a task can
// read nor in edge's logs.
func TestAWSClientsThroughEdge(t *testing.T) {
	front := startAWSFront(t)
	f := newFixture(t)
	e := openAWSHost(f, front, nil)
	// The stale-date refusal needs edge's clock 20 minutes off the task's
	// (behind, so that the leaves edge mints are valid already).
	fSkew := newFixture(t)
	eSkew := openAWSHost(fSkew, front, skewedClock{offset: -20 * time.Minute})
	id := front.Identity
	runs := &awsRuns{}
	assumeRoleDone := false

	t.Run("Clients", func(t *testing.T) {
		t.Run("STS", func(t *testing.T) {
			t.Parallel()
			r := runs.run(t, e, "AWS_MAIN", time.Minute, awsPrompt(true,
				awsStep{"sts", awsCallerIdentity},
				awsStep{"sts-transparent", "env -u HTTPS_PROXY -u https_proxy " + awsCallerIdentity}))
			for _, step := range []string{"sts", "sts-transparent"} {
				if got := strings.TrimSpace(r.step(t, step)); got != id.RealUserARN {
					t.Errorf("%s: aws sts get-caller-identity printed %q, want %q", step, got, id.RealUserARN)
				}
			}
			via := map[string]int{}
			for _, l := range awsAudit(t, f, r.id, audit.Substituted, 2) {
				if l.Host != "sts.us-east-1.amazonaws.com:443" || l.AWS == nil || *l.AWS != (audit.AWSSigning{Region: "us-east-1", Service: "sts", Payload: "literal"}) {
					t.Errorf("an audit line of the STS calls: %+v (aws %+v)", l, l.AWS)
				}
				via[l.Via]++
			}
			if via[""] != 1 || via[audit.ViaTransparent] != 1 {
				t.Errorf("the STS calls' audit lines came via %v, want one each through the explicit and the transparent proxy", via)
			}
		})
		t.Run("S3CLI", func(t *testing.T) {
			t.Parallel()
			r := runs.run(t, e, "AWS_MAIN", 100*time.Second, awsPrompt(false, awsStep{"s3", awsS3CLIScript}))
			text := r.step(t, "s3")
			up := lineValue(t, text, "up")
			if down := lineValue(t, text, "down"); down != up {
				t.Errorf("the 64 MiB file came down with sha256 %s, went up with %s", down, up)
			}
			if up, down := lineValue(t, text, "streamup"), lineValue(t, text, "streamdown"); down != up {
				t.Errorf("the stream came down with sha256 %s, went up with %s", down, up)
			}
			small := lineValue(t, text, "small")
			for _, name := range []string{"checksum", "signed", "presigned"} {
				if got := lineValue(t, text, name); got != small {
					t.Errorf("%s: came down with sha256 %s, went up with %s", name, got, small)
				}
			}
		})
		t.Run("DynamoDB", func(t *testing.T) {
			t.Parallel()
			r := runs.run(t, e, "AWS_MAIN", time.Minute, awsPrompt(false, awsStep{"dynamodb", awsDynamoScript}))
			text := r.step(t, "dynamodb")
			if !strings.Contains(text, awsTable+"\n") || lineValue(t, text, "got") != "through edge" {
				t.Errorf("the DynamoDB round trip printed:\n%s", text)
			}
			if got := lineValue(t, text, "big"); got != "200000" {
				t.Errorf("the big item came back with %s characters, want 200000", got)
			}
		})
		t.Run("Boto3Pipe", func(t *testing.T) {
			t.Parallel()
			r := runs.run(t, e, "AWS_MAIN", time.Minute, awsPrompt(false, awsStep{"boto3", awsBotoPipeScript}))
			text := r.step(t, "boto3")
			up := lineValue(t, text, "up")
			if !strings.HasPrefix(up, "20971520:") {
				t.Errorf("boto3 read %s of the pipe (bytes:sha256), want 20971520 bytes", up)
			}
			if down := lineValue(t, text, "down"); down != up {
				t.Errorf("boto3 downloaded %s, uploaded %s (bytes:sha256)", down, up)
			}
			if got := lineValue(t, text, "checksum"); got != "True" {
				t.Errorf("boto3's object with a CRC32 checksum came back different")
			}
		})
		// An AWS answer may quote the real access key id (error bodies do; IAM's
		// ListAccessKeys lists it): the task reads its placeholder instead.
		t.Run("AnswerScrubbed", func(t *testing.T) {
			t.Parallel()
			r := runs.run(t, e, "AWS_MAIN", time.Minute, awsPrompt(false, awsStep{"iam",
				"aws iam list-access-keys --user-name " + awsfront.RealUserName + " --output text --query 'AccessKeyMetadata[].AccessKeyId'"}))
			if got := strings.TrimSpace(r.step(t, "iam")); got != r.akid {
				t.Errorf("ListAccessKeys answered the task %q, want its placeholder %q", got, r.akid)
			}
			lines := awsAudit(t, f, r.id, audit.Substituted, 1)
			if len(lines) != 1 || lines[0].Scrubbed != 1 {
				t.Errorf("the ListAccessKeys audit: %+v, want one line that scrubbed one value", lines)
			}
		})
		t.Run("AssumeRole", func(t *testing.T) {
			t.Parallel()
			// Refused at admission: the task never starts.
			run := e.start(runspec.Request{Prompt: "echo started", Secrets: awsSecrets("AWS_NOROLE")})
			end := e.waitEnd(run.RunID)
			if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonBrokerNotReady ||
				!strings.Contains(end.Detail, "sts:AssumeRole of arn:aws:iam::"+id.AccountID+":role/runfleet-missing") || !strings.Contains(end.Detail, "AccessDenied") {
				t.Errorf("a run whose role cannot be assumed ended %+v, want failed %s with a detail naming the role and STS's answer", end, hostproto.ReasonBrokerNotReady)
			}
			if strings.Contains(e.output(run.RunID), "started") {
				t.Errorf("the task of a run whose role cannot be assumed started")
			}
			leakcheck.AssertClean(t, "the refusal's detail", []byte(end.Detail), leakcheck.Real{Key: "edge's secret", Value: id.Edge.SecretAccessKey})
			leakcheck.AssertClean(t, "the refusal's detail", []byte(end.Detail), leakcheck.Real{Key: "edge's access key id", Value: id.Edge.AccessKeyID, Public: 4})

			// Each run its own session, named after it.
			var arns []string
			for range 2 {
				r := runs.run(t, e, "AWS_ROLE", time.Minute, awsPrompt(false, awsStep{"sts", awsCallerIdentity + "\necho \"token=${AWS_SESSION_TOKEN:+set}\""}))
				if !strings.HasPrefix(r.akid, "ASIA") {
					t.Errorf("a role's session gave the task the access key id %q, want a temporary one (ASIA...)", r.akid)
				}
				text := r.step(t, "sts")
				arn, _, _ := strings.Cut(text, "\n")
				if want := "arn:aws:sts::" + id.AccountID + ":assumed-role/" + awsfront.RoleName + "/runfleet-" + r.id; arn != want {
					t.Errorf("the role's task is %q, want %q", arn, want)
				}
				if lineValue(t, text, "token") != "set" {
					t.Errorf("the role's task has no AWS_SESSION_TOKEN")
				}
				arns = append(arns, arn)
			}
			if arns[0] == arns[1] {
				t.Errorf("two runs had one session: %s", arns[0])
			}
			assumeRoleDone = true
		})
	})

	// Everything forwarded so far: the clients' requests reached moto
	// signed with the real key (or a role's session), never a placeholder,
	// and moto took them.
	placeholders := map[string]bool{}
	for _, r := range runs.all() {
		placeholders[r.akid] = true
	}
	byClient := map[string][]awsfront.Record{}
	for _, r := range front.Records() {
		if placeholders[r.AccessKeyID] {
			t.Errorf("the front got a task's placeholder access key id: %+v", r)
		}
		if r.Upstream != awsfront.Answered || r.Status >= 300 && r.AccessKeyID != id.Edge.AccessKeyID {
			t.Errorf("a request of the clients did not succeed at moto: %+v", r)
		}
		var client string
		switch {
		case r.AccessKeyID == id.Edge.AccessKeyID:
			client = "edge (sts:AssumeRole)"
		case r.AccessKeyID != id.Real.AccessKeyID:
			client = "aws-cli (a role's session)"
			if !r.SecurityToken {
				t.Errorf("a request signed with a role's session has no session token: %+v", r)
			}
		case r.Auth == awsfront.AuthPresigned:
			client = "curl (aws s3 presign)"
		case strings.HasPrefix(r.Host, awsBotoBucket+"."):
			client = "boto3"
		case strings.HasPrefix(r.Path, "/signed/"):
			client = "aws-cli (payload_signing_enabled)"
		case strings.HasPrefix(r.Path, "/checksum/"):
			client = "aws-cli (s3api --checksum-algorithm CRC32)"
		case strings.HasPrefix(r.Host, awsCLIBucket+"."):
			client = "aws-cli s3"
		default:
			client = "aws-cli " + strings.SplitN(r.Host, ".", 2)[0]
		}
		if client != "edge (sts:AssumeRole)" && client != "aws-cli (a role's session)" && r.SecurityToken {
			t.Errorf("a request signed with the real key carries a session token: %+v", r)
		}
		byClient[client] = append(byClient[client], r)
	}
	// The payload modes each client's requests reached moto with.
	modes := map[string]map[string]bool{}
	for client, rs := range byClient {
		ops := map[string]map[string]int{}
		modes[client] = map[string]bool{}
		for _, r := range rs {
			op := awsOperation(r)
			if ops[op] == nil {
				ops[op] = map[string]int{}
			}
			ops[op][payloadMode(r)]++
			modes[client][payloadMode(r)] = true
		}
		t.Logf("%s: %d requests; payload modes by operation: %v", client, len(rs), ops)
	}
	for client, want := range map[string]string{
		"aws-cli s3": "UNSIGNED-PAYLOAD",
		"aws-cli (s3api --checksum-algorithm CRC32)": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
		"aws-cli (payload_signing_enabled)":          "literal",
		"boto3":                                      "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
		"curl (aws s3 presign)":                      "presigned",
	} {
		if !modes[client][want] {
			t.Errorf("%s: payload modes %v, want %s among them", client, modes[client], want)
		}
	}
	if n := len(byClient["edge (sts:AssumeRole)"]); assumeRoleDone && n != 3 {
		t.Errorf("edge called sts:AssumeRole %d times, want 3 (two sessions, one refused)", n)
	}

	t.Run("Refusals", func(t *testing.T) {
		before := len(front.Records())
		r := runs.run(t, e, "AWS_MAIN", time.Minute, awsPrompt(true,
			awsStep{"wrong-secret-s3", "AWS_SECRET_ACCESS_KEY=wrong aws s3 ls s3://" + awsCLIBucket},
			awsStep{"wrong-secret-sts", "AWS_SECRET_ACCESS_KEY=wrong aws sts get-caller-identity"},
			awsStep{"other-region", "aws sts get-caller-identity --region eu-west-1 --endpoint-url https://sts.us-east-1.amazonaws.com"},
			awsStep{"other-service", "aws s3api list-buckets --endpoint-url https://sts.us-east-1.amazonaws.com"},
			awsStep{"other-domain", "aws s3 ls s3://" + awsOtherBucket},
			awsStep{"sigv2", `/usr/bin/python3 -c 'import boto3; from botocore.config import Config; boto3.client("s3", config=Config(signature_version="s3")).list_buckets()'`},
		))
		rs := runs.run(t, eSkew, "AWS_MAIN", time.Minute, awsPrompt(false, awsStep{"stale", awsCallerIdentity}))

		// Edge answers a refused SigV4 request as the service answers an
		// error, so every client shows edge's reason as AWS's message.
		for step, reason := range map[string]string{
			"wrong-secret-s3": "signature_mismatch", "wrong-secret-sts": "signature_mismatch",
			"other-region": "scope_refused", "other-service": "scope_refused", "sigv2": "sigv2_unsupported",
		} {
			if text := r.failed(t, step); !strings.Contains(text, "runfleet edge: "+reason) {
				t.Errorf("%s: the client does not show edge's refusal %s:\n%s", step, reason, text)
			}
		}
		if text := rs.failed(t, "stale"); !strings.Contains(text, "runfleet edge: stale_date") {
			t.Errorf("stale: the client does not show edge's refusal stale_date:\n%s", text)
		}
		// Outside the key's domains the connection is not the key's:
		// edge tunnels it (egress open) to the name's address, the front,
		// whose certificate the task does not trust. Nothing is signed
		// again, nothing reaches moto.
		if text := r.failed(t, "other-domain"); !strings.Contains(text, "CERTIFICATE_VERIFY_FAILED") {
			t.Errorf("other-domain: want the task's TLS check to fail on the tunnel:\n%s", text)
		}

		// Each refusal's audit line, by host and the start of its reason.
		type want struct{ host, reason string }
		const sts = "sts.us-east-1.amazonaws.com:443"
		wants := []want{
			{awsCLIBucket + ".s3.us-east-1.amazonaws.com:443", "signature_mismatch: "},
			{sts, "signature_mismatch: "},
			{sts, `scope_refused: region "eu-west-1" is outside key acme/AWS_MAIN's regions`},
			{sts, "scope_refused: the request is signed for s3 in us-east-1 but goes to sts.us-east-1.amazonaws.com"},
			{"s3.amazonaws.com:443", "sigv2_unsupported: "},
		}
		lines := awsAudit(t, f, r.id, audit.Blocked, len(wants))
		got := map[want]int{}
		tunnels := 0
		for _, l := range lines {
			switch l.Action {
			case audit.Blocked:
				matched := false
				for _, w := range wants {
					if l.Host == w.host && strings.HasPrefix(l.Reason, w.reason) {
						got[w]++
						matched = true
					}
				}
				if !matched || l.Status != 403 || !slices.Equal(l.Keys, []string{"acme/AWS_MAIN"}) {
					t.Errorf("an unexpected refusal in the audit: %+v", l)
				}
			case audit.Tunnelled:
				if l.Host != awsOtherBucket+".s3.us-east-1.amazonaws.com:443" || len(l.Keys) != 0 {
					t.Errorf("an unexpected tunnel in the audit: %+v", l)
				}
				tunnels++
			default:
				t.Errorf("the refusals' run has an audit line %+v", l)
			}
		}
		for _, w := range wants {
			if got[w] != 1 {
				t.Errorf("the audit has %d blocked lines at %s for %q, want 1", got[w], w.host, w.reason)
			}
		}
		if tunnels == 0 {
			t.Errorf("the audit has no tunnel to %s", awsOtherBucket)
		}
		stale := awsAudit(t, fSkew, rs.id, audit.Blocked, 1)
		if len(stale) != 1 || !strings.HasPrefix(stale[0].Reason, "stale_date: ") || stale[0].Host != sts {
			t.Errorf("the stale request's audit: %+v, want one line blocked stale_date", stale)
		}
		for _, rec := range front.Records()[before:] {
			t.Errorf("a refused request reached the front: %+v", rec)
		}
	})

	t.Run("NoLeak", func(t *testing.T) {
		reals := []leakcheck.Real{
			{Key: "the real access key id", Value: id.Real.AccessKeyID, Public: 4},
			{Key: "the real secret", Value: id.Real.SecretAccessKey},
			{Key: "edge's access key id", Value: id.Edge.AccessKeyID, Public: 4},
			{Key: "edge's secret", Value: id.Edge.SecretAccessKey},
		}
		for _, r := range byClient["aws-cli (a role's session)"] {
			reals = append(reals, leakcheck.Real{Key: "a role session's access key id", Value: r.AccessKeyID, Public: 4})
		}
		// What a task could read: its output (the clients' answers among
		// it) and every file it wrote.
		for _, r := range runs.all() {
			events, err := json.Marshal(r.host.events(r.id))
			must(t, err)
			for _, real := range reals {
				leakcheck.AssertClean(t, "run "+r.id+"'s events", events, real)
			}
			files := 0
			for _, dir := range []string{"home", "work", "tmp", "var-tmp"} {
				err := filepath.WalkDir(filepath.Join(r.host.f.dataDir, "work", r.id, dir), func(path string, d fs.DirEntry, err error) error {
					if err != nil || d.IsDir() {
						return err
					}
					b, err := os.ReadFile(path)
					if err != nil {
						return err
					}
					files++
					for _, real := range reals {
						leakcheck.AssertClean(t, path, b, real)
					}
					return nil
				})
				if err != nil && !errors.Is(err, fs.ErrNotExist) {
					t.Error(err)
				}
			}
			if files < 2 {
				t.Errorf("run %s left %d files to read, want its two AWS config files at least", r.id, files)
			}
		}
		// Edge's log and audit hold no form of them: they are redacted.
		for _, x := range []*edgeHost{e, eSkew} {
			audited, err := os.ReadFile(filepath.Join(x.f.dataDir, "logs", audit.FileName))
			must(t, err)
			for what, b := range map[string][]byte{"edge's log": []byte(x.logs.String()), "edge's audit": audited} {
				for _, real := range reals {
					for _, form := range leakcheck.Forms(real.Value) {
						if bytes.Contains(b, []byte(form.Text)) {
							t.Errorf("%s holds %s (%s)", what, real.Key, form.Name)
						}
					}
				}
			}
		}
	})
}
