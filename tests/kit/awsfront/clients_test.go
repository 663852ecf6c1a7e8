package awsfront

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// debianClientScript drives Debian's boto3 (botocore 1.29) at the front:
// an aws-chunked upload with a trailing checksum (sent with
// Transfer-Encoding: chunked, which that botocore signs), keys and a list
// moto misreads, a SigV4 presigned GET, and STS. It prints one line per
// step; a failure raises.
const debianClientScript = `
import sys, ssl, urllib.request
import boto3
from botocore.config import Config
endpoint, key_id, secret, ca = sys.argv[1:5]
s = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret, region_name="us-east-1")
c = s.client("s3", endpoint_url=endpoint, verify=ca, config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
c.create_bucket(Bucket="debian-clients")
for key in ["plain", "dir/a+b"]:
    c.put_object(Bucket="debian-clients", Key=key, Body=b"x" * 300000, ChecksumAlgorithm="CRC32")
    print("put", key)
listed = [o["Key"] for o in c.list_objects_v2(Bucket="debian-clients", Prefix="dir/", Delimiter="/")["Contents"]]
print("list", ",".join(listed))
url = c.generate_presigned_url("get_object", Params={"Bucket": "debian-clients", "Key": "dir/a+b"})
print("presigned", len(urllib.request.urlopen(url, context=ssl.create_default_context(cafile=ca)).read()))
print("caller", s.client("sts", endpoint_url=endpoint, verify=ca).get_caller_identity()["Arn"])
`

// TestDebianClients: the Python clients the end-to-end tests run in
// tasks (infra/scripts/test-deps.sh installs them) sign as the front
// checks and moto accepts. They reach the front by address here; through
// edge they use the AWS names.
func TestDebianClients(t *testing.T) {
	f := StartT(t, Config{Names: []string{"127.0.0.1"}})
	endpoint := "https://" + f.Addr
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "AWS_ACCESS_KEY_ID=" + f.Identity.Real.AccessKeyID,
		"AWS_SECRET_ACCESS_KEY=" + f.Identity.Real.SecretAccessKey, "AWS_DEFAULT_REGION=" + Region, "AWS_CA_BUNDLE=" + f.CAFile}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	out := run("/usr/bin/python3", "-c", debianClientScript, endpoint, f.Identity.Real.AccessKeyID, f.Identity.Real.SecretAccessKey, f.CAFile)
	for _, want := range []string{"put plain", "put dir/a+b", "list dir/a+b", "presigned 300000", "caller " + f.Identity.RealUserARN} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("boto3: no %q in:\n%s", want, out)
		}
	}

	file := filepath.Join(t.TempDir(), "upload")
	if err := os.WriteFile(file, []byte(strings.Repeat("y", 1<<20)), 0o600); err != nil {
		t.Fatal(err)
	}
	run("/usr/bin/aws", "--endpoint-url", endpoint, "s3", "cp", file, "s3://debian-clients/cli/a=b")
	if out := run("/usr/bin/aws", "--endpoint-url", endpoint, "s3", "ls", "s3://debian-clients/cli/"); !strings.Contains(out, " 1048576 a=b") {
		t.Errorf("aws s3 ls: %s", out)
	}
	for _, r := range f.Records() {
		if r.Status != 200 {
			t.Errorf("a client's request answered %d: %+v", r.Status, r)
		}
	}
}
