/*
 * test_sigv4.c - the SigV4 signer against published vectors: the four
 * worked S3 examples of AWS's "Signature Calculations for the Authorization
 * Header" page (GET Object with Range, PUT Object, GET Bucket Lifecycle, GET
 * Bucket list), two vectors of AWS's generic SigV4 test suite (get-vanilla,
 * get-vanilla-query-order-key-case), and three S3 requests of the shapes
 * ckptfs sends (ranged GET with session token and UNSIGNED-PAYLOAD,
 * ListObjectsV2 with a continuation token, UploadPart with a hashed body)
 * whose values were computed independently with botocore.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sigv4.h"

#define H(n, v)                                                                                              \
	{                                                                                                    \
		n, v                                                                                         \
	}

static const struct ckpt_sigv4_creds aws_doc = { "AKIAIOSFODNN7EXAMPLE",
						 "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1",
						 "s3" };
static const struct ckpt_sigv4_creds suite = { "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
					       "us-east-1", "service" };
static const struct ckpt_sigv4_creds v123 = { "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
					      "us-east-1", "s3" };

static void check_sig(const struct ckpt_sigv4_creds *c, const char *date, const char *method, const char *uri,
		      const char *query, const struct ckpt_sigv4_header *h, size_t nh, const char *payload,
		      const char *want_canon_hash, const char *want_sig)
{
	char *sh = NULL;
	char *canon = ckpt_sigv4_canonical(method, uri, query, h, nh, payload, &sh);
	CHECK(canon != NULL);
	if (want_canon_hash && canon) {
		char hh[65];
		ckpt_sha256_hex(canon, strlen(canon), hh);
		CHECK(strcmp(hh, want_canon_hash) == 0);
		if (strcmp(hh, want_canon_hash) != 0)
			fprintf(stderr, "canonical request was:\n%s\n", canon);
	}
	free(canon);
	free(sh);
	char sig[65];
	char *auth = ckpt_sigv4_sign(c, date, method, uri, query, h, nh, payload, sig);
	CHECK(auth != NULL);
	CHECK(strcmp(sig, want_sig) == 0);
	if (strcmp(sig, want_sig) != 0)
		fprintf(stderr, "signature %s, want %s\n", sig, want_sig);
	CHECK(auth && strstr(auth, want_sig) != NULL);
	free(auth);
}

static void test_aws_s3_examples(void)
{
	const char *d = "20130524T000000Z";
	/* GET Object, first 10 bytes */
	struct ckpt_sigv4_header get[] = { H("Host", "examplebucket.s3.amazonaws.com"),
					   H("Range", "bytes=0-9"),
					   H("x-amz-content-sha256", CKPT_SHA256_EMPTY), H("x-amz-date", d) };
	check_sig(&aws_doc, d, "GET", "/test.txt", "", get, 4, CKPT_SHA256_EMPTY,
		  "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
		  "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
	char *auth = ckpt_sigv4_sign(&aws_doc, d, "GET", "/test.txt", "", get, 4, CKPT_SHA256_EMPTY, NULL);
	CHECK(auth &&
	      strcmp(auth,
		     "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
		     "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
		     "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41") == 0);
	free(auth);

	/* PUT Object "test$file.text" */
	char body_hash[65];
	ckpt_sha256_hex("Welcome to Amazon S3.", 21, body_hash);
	CHECK(strcmp(body_hash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072") == 0);
	char *key = ckpt_sigv4_uri_encode("/test$file.text", 1);
	CHECK(key && strcmp(key, "/test%24file.text") == 0);
	struct ckpt_sigv4_header put[] = { H("Date", "Fri, 24 May 2013 00:00:00 GMT"),
					   H("Host", "examplebucket.s3.amazonaws.com"),
					   H("x-amz-content-sha256", body_hash), H("x-amz-date", d),
					   H("x-amz-storage-class", "REDUCED_REDUNDANCY") };
	check_sig(&aws_doc, d, "PUT", key, "", put, 5, body_hash, NULL,
		  "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
	free(key);

	/* GET Bucket Lifecycle: a parameter without a value */
	const char *ln[] = { "lifecycle" };
	char *q = ckpt_sigv4_query(ln, NULL, 1);
	CHECK(q && strcmp(q, "lifecycle=") == 0);
	struct ckpt_sigv4_header bucket[] = { H("Host", "examplebucket.s3.amazonaws.com"),
					      H("x-amz-content-sha256", CKPT_SHA256_EMPTY),
					      H("x-amz-date", d) };
	check_sig(&aws_doc, d, "GET", "/", q, bucket, 3, CKPT_SHA256_EMPTY, NULL,
		  "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
	free(q);

	/* GET Bucket (list objects): parameters sorted */
	const char *lkn[] = { "prefix", "max-keys" }, *lkv[] = { "J", "2" };
	q = ckpt_sigv4_query(lkn, lkv, 2);
	CHECK(q && strcmp(q, "max-keys=2&prefix=J") == 0);
	check_sig(&aws_doc, d, "GET", "/", q, bucket, 3, CKPT_SHA256_EMPTY, NULL,
		  "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
	free(q);
}

static void test_aws_suite(void)
{
	const char *d = "20150830T123600Z";
	struct ckpt_sigv4_header h[] = { H("Host", "example.amazonaws.com"), H("X-Amz-Date", d) };
	check_sig(&suite, d, "GET", "/", "", h, 2, CKPT_SHA256_EMPTY, NULL,
		  "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
	char *auth = ckpt_sigv4_sign(&suite, d, "GET", "/", "", h, 2, CKPT_SHA256_EMPTY, NULL);
	CHECK(auth &&
	      strcmp(auth,
		     "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
		     "SignedHeaders=host;x-amz-date, "
		     "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31") == 0);
	free(auth);
	const char *n[] = { "Param2", "Param1" }, *v[] = { "value2", "value1" };
	char *q = ckpt_sigv4_query(n, v, 2);
	CHECK(q && strcmp(q, "Param1=value1&Param2=value2") == 0);
	check_sig(&suite, d, "GET", "/", q, h, 2, CKPT_SHA256_EMPTY, NULL,
		  "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
	free(q);
}

static void test_ckptfs_shapes(void)
{
	const char *d = "20260102T030405Z";
	/* V1: ranged GET, session token, UNSIGNED-PAYLOAD, key needing encoding */
	char *path = ckpt_sigv4_uri_encode("/ckpt/run 1/100/state/ocdbt.process_0/d/a+b=c~d.data", 1);
	CHECK(path && strcmp(path, "/ckpt/run%201/100/state/ocdbt.process_0/d/a%2Bb%3Dc~d.data") == 0);
	struct ckpt_sigv4_header g[] = { H("host", "127.0.0.1:4568"), H("range", "bytes=1048576-2097151"),
					 H("x-amz-content-sha256", "UNSIGNED-PAYLOAD"), H("x-amz-date", d),
					 H("x-amz-security-token", "FQoGZXIvYXdzEXAMPLETOKEN//+=") };
	check_sig(&v123, d, "GET", path, "", g, 5, "UNSIGNED-PAYLOAD",
		  "bd1ce768e0d57856a219978af5e4d6956865353a01d48e201ef278b86ef2d2b3",
		  "289e958248fd867b1179c514915b467c7d26ddb28dcf574cca5032078ff6b407");
	free(path);

	/* V2: ListObjectsV2 with a continuation token that needs re-encoding */
	const char *ln[] = { "list-type", "prefix", "delimiter", "continuation-token", "max-keys" };
	const char *lv[] = { "2", "run 1/100/", "/", "1bKe+X/g==", "1000" };
	char *q = ckpt_sigv4_query(ln, lv, 5);
	CHECK(q && strcmp(q, "continuation-token=1bKe%2BX%2Fg%3D%3D&delimiter=%2F&list-type=2&max-keys=1000&"
			     "prefix=run%201%2F100%2F") == 0);
	struct ckpt_sigv4_header l[] = { H("host", "127.0.0.1:4568"),
					 H("x-amz-content-sha256", CKPT_SHA256_EMPTY), H("x-amz-date", d) };
	check_sig(&v123, d, "GET", "/ckpt", q, l, 3, CKPT_SHA256_EMPTY,
		  "c669b322cb2bea95910d56af66a46681845edff697605082d7937fb49d8d9561",
		  "85d6bc3710f16f086c3ad45e947a581d355e7764cf43daaeb1eb0724e5194647");
	free(q);

	/* V3: UploadPart with a hashed 6-byte body */
	char bh[65];
	ckpt_sha256_hex("hello\n", 6, bh);
	CHECK(strcmp(bh, "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03") == 0);
	const char *pn[] = { "uploadId", "partNumber" }, *pv[] = { "2b7b135f19a0376798e5c13593db1fe1", "1" };
	q = ckpt_sigv4_query(pn, pv, 2);
	CHECK(q && strcmp(q, "partNumber=1&uploadId=2b7b135f19a0376798e5c13593db1fe1") == 0);
	struct ckpt_sigv4_header p[] = { H("content-length", "6"), H("host", "127.0.0.1:4568"),
					 H("x-amz-content-sha256", bh), H("x-amz-date", d) };
	check_sig(&v123, d, "PUT", "/ckpt/run%201/100/state/d/big", q, p, 4, bh,
		  "44997c4c05152dfd099de1b1958caef56ee27cf416dec17ce1be9287b90326cb",
		  "5dde4565758bdfe03ee29bbe1d20f44073dbda032cd887400f63a78e2a8ba6bc");
	free(q);
}

static void test_helpers(void)
{
	char d[17];
	ckpt_sigv4_amz_date(1369353600, d); /* 2013-05-24 00:00:00 UTC */
	CHECK(strcmp(d, "20130524T000000Z") == 0);
	char *e = ckpt_sigv4_uri_encode("a b/ü~%", 0);
	CHECK(e && strcmp(e, "a%20b%2F%C3%BC~%25") == 0);
	free(e);
	/* header values: trimmed, inner runs collapsed, names lower-cased and sorted */
	struct ckpt_sigv4_header h[] = { H("X-Amz-Meta-B", "  two   words  "), H("Host", "h") };
	char *sh = NULL;
	char *c = ckpt_sigv4_canonical("GET", "", "", h, 2, "UNSIGNED-PAYLOAD", &sh);
	CHECK(c &&
	      strcmp(c, "GET\n/\n\nhost:h\nx-amz-meta-b:two words\n\nhost;x-amz-meta-b\nUNSIGNED-PAYLOAD") ==
		      0);
	CHECK(sh && strcmp(sh, "host;x-amz-meta-b") == 0);
	free(c);
	free(sh);
}

int main(void)
{
	CHECK_RUN(test_aws_s3_examples);
	CHECK_RUN(test_aws_suite);
	CHECK_RUN(test_ckptfs_shapes);
	CHECK_RUN(test_helpers);
	return CHECK_DONE();
}
