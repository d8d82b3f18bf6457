/*
 * s3_creds.c - who the object store's requests are sent as: the region,
 * then the credentials, found once at open in the order store.h gives
 * (options, environment, shared credentials and config files of the
 * profile, token file, GOOGLE_OAUTH_ACCESS_TOKEN, the GCE metadata server,
 * else anonymous), and bearer tokens kept fresh while the store lives
 * (the token file re-read when it changes, metadata-server tokens fetched
 * again a minute before they expire).
 *
 * Secrets are zeroed before they are freed and never reach a log line:
 * only the source of the credentials and the first characters of a key id
 * are logged.  Calls only http.c (the metadata server's answers); s->mu
 * guards the bearer token.
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common.h"
#include "http.h"
#include "s3_int.h"

/* A token from the GCE metadata server, kept until a minute before it expires. */
static int metadata_refresh(struct s3_store *s)
{
	time_t now = time(NULL);
	pthread_mutex_lock(&s->mu);
	int fresh = s->bearer && now < s->bearer_expiry;
	pthread_mutex_unlock(&s->mu);
	if (fresh)
		return 0;
	const char *hdrs[] = { "Metadata-Flavor: Google", NULL };
	struct ckpt_http_req req = { "GET", s->meta_url, hdrs, NULL, 0, NULL, 0, 65536 };
	struct ckpt_http_resp resp;
	int rc = -EIO;
	char what[160];
	for (unsigned a = 1; a <= 3; a++) {
		rc = ckpt_http_perform(s->http, &req, &resp);
		if (rc == 0 && resp.status == 200)
			break;
		if (a == 3 || !ckpt_http_retryable(rc, &resp)) {
			ckpt_log(CKPT_LOG_ERR, "%s: metadata server token: %s", s->base.root,
				 ckpt_http_what(rc, &resp, what, sizeof(what)));
			ckpt_http_resp_free(&resp);
			return -EACCES;
		}
		ckpt_http_resp_free(&resp);
		ckpt_http_backoff(a, s->retry_base_ms);
	}
	cJSON *j = cJSON_ParseWithLength(resp.body ? resp.body : "", resp.len);
	if (resp.body)
		memset(resp.body, 0, resp.len);
	ckpt_http_resp_free(&resp);
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "access_token");
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "expires_in");
	char *tok = cJSON_IsString(t) && *t->valuestring ? strdup(t->valuestring) : NULL;
	double life = cJSON_IsNumber(e) ? e->valuedouble : 300;
	if (cJSON_IsString(t))
		memset(t->valuestring, 0, strlen(t->valuestring));
	cJSON_Delete(j);
	if (!tok) {
		ckpt_log(CKPT_LOG_ERR, "%s: metadata server token: no access_token in the answer",
			 s->base.root);
		return -EACCES;
	}
	pthread_mutex_lock(&s->mu);
	free_secret(s->bearer);
	s->bearer = tok;
	s->bearer_expiry = now + (time_t)(life > 120 ? life - 60 : life / 2);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

int ckpt_s3_bearer_refresh(struct s3_store *s)
{
	if (s->meta_url)
		return metadata_refresh(s);
	if (!s->token_file)
		return 0;
	struct stat st;
	if (stat(s->token_file, &st) != 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: token file %s: %s", s->base.root, s->token_file, strerror(errno));
		return -EACCES;
	}
	pthread_mutex_lock(&s->mu);
	int same = s->bearer && st.st_mtim.tv_sec == s->bearer_mtime.tv_sec &&
		   st.st_mtim.tv_nsec == s->bearer_mtime.tv_nsec;
	pthread_mutex_unlock(&s->mu);
	if (same)
		return 0;
	FILE *f = fopen(s->token_file, "r");
	char buf[8192];
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = 0;
	while (n && isspace((unsigned char)buf[n - 1]))
		buf[--n] = 0;
	char *p = buf;
	while (isspace((unsigned char)*p))
		p++;
	if (!*p) {
		ckpt_log(CKPT_LOG_ERR, "%s: token file %s is empty or unreadable", s->base.root,
			 s->token_file);
		return -EACCES;
	}
	char *t = strdup(p);
	memset(buf, 0, sizeof(buf));
	if (!t)
		return -ENOMEM;
	pthread_mutex_lock(&s->mu);
	free_secret(s->bearer);
	s->bearer = t;
	s->bearer_mtime = st.st_mtim;
	pthread_mutex_unlock(&s->mu);
	return 0;
}

/* ---------------------------------------------------------------- configuration */

/* Value of `key` in section `section` of an INI file (malloc'd), or NULL. */
static char *ini_get(const char *path, const char *section, const char *key, int *section_seen)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char line[4096];
	int in = 0;
	char *val = NULL;
	while (!val && fgets(line, sizeof(line), f)) {
		char *p = line;
		while (isspace((unsigned char)*p))
			p++;
		char *e = p + strlen(p);
		while (e > p && isspace((unsigned char)e[-1]))
			*--e = 0;
		if (*p == '#' || *p == ';' || !*p)
			continue;
		if (*p == '[') {
			char *cl = strchr(p, ']');
			if (!cl)
				continue;
			*cl = 0;
			p++;
			while (isspace((unsigned char)*p))
				p++;
			char *q = p + strlen(p);
			while (q > p && isspace((unsigned char)q[-1]))
				*--q = 0;
			in = strcmp(p, section) == 0;
			if (in && section_seen)
				*section_seen = 1;
			continue;
		}
		if (!in)
			continue;
		char *eq = strchr(p, '=');
		if (!eq)
			continue;
		char *k = p, *ke = eq;
		while (ke > k && isspace((unsigned char)ke[-1]))
			ke--;
		*ke = 0;
		char *v = eq + 1;
		while (isspace((unsigned char)*v))
			v++;
		if (strcmp(k, key) == 0)
			val = strdup(v);
	}
	memset(line, 0, sizeof(line));
	fclose(f);
	return val;
}

static char *home_path(const char *env, const char *rel)
{
	const char *e = getenv(env);
	if (e && *e)
		return strdup(e);
	const char *home = getenv("HOME");
	if (!home || !*home)
		return NULL;
	char *p = NULL;
	if (asprintf(&p, "%s/%s", home, rel) < 0)
		return NULL;
	return p;
}

/* Credentials: environment, then the shared credentials file and the config
 * file (profile).  Sets s->auth. */
static int find_creds(struct s3_store *s, const char *profile_opt, int *profile_region_set)
{
	const char *ak = env_nonempty("AWS_ACCESS_KEY_ID"), *sk = env_nonempty("AWS_SECRET_ACCESS_KEY");
	const char *tok = env_nonempty("AWS_SESSION_TOKEN");
	if (!tok)
		tok = env_nonempty("AWS_SECURITY_TOKEN");
	const char *prof = profile_opt;
	int explicit_profile = prof != NULL;
	if (!prof && (prof = env_nonempty("AWS_PROFILE")))
		explicit_profile = 1;
	if (!prof && (prof = env_nonempty("AWS_DEFAULT_PROFILE")))
		explicit_profile = 1;
	if (!prof)
		prof = "default";
	char *cred = home_path("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
	char *conf = home_path("AWS_CONFIG_FILE", ".aws/config");
	char confsec[300];
	if (strcmp(prof, "default") == 0)
		snprintf(confsec, sizeof(confsec), "default");
	else
		snprintf(confsec, sizeof(confsec), "profile %s", prof);
	int seen = 0;
	int rc = 0;
	/* region from the profile (used when no option / env gave one) */
	if (!s->region && conf) {
		s->region = ini_get(conf, confsec, "region", &seen);
		if (s->region)
			*profile_region_set = 1;
	}
	if (ak && sk && !profile_opt) {
		s->akid = strdup(ak);
		s->secret = strdup(sk);
		s->session_token = xstrdup(tok);
		s->auth = AUTH_SIGV4;
		ckpt_log(CKPT_LOG_INFO, "%s: credentials from the environment (key id %.4s...)", s->base.root,
			 ak);
		goto out;
	}
	char *a = NULL, *b = NULL, *t = NULL;
	if (cred) {
		a = ini_get(cred, prof, "aws_access_key_id", &seen);
		b = ini_get(cred, prof, "aws_secret_access_key", &seen);
		t = ini_get(cred, prof, "aws_session_token", &seen);
	}
	if ((!a || !b) && conf) {
		free(a);
		free_secret(b);
		free_secret(t);
		a = ini_get(conf, confsec, "aws_access_key_id", &seen);
		b = ini_get(conf, confsec, "aws_secret_access_key", &seen);
		t = ini_get(conf, confsec, "aws_session_token", &seen);
	}
	if (a && b) {
		s->akid = a;
		s->secret = b;
		s->session_token = t;
		s->auth = AUTH_SIGV4;
		ckpt_log(CKPT_LOG_INFO, "%s: credentials from profile '%s' (key id %.4s...)", s->base.root,
			 prof, a);
		goto out;
	}
	free(a);
	free_secret(b);
	free_secret(t);
	if (explicit_profile && !seen) {
		ckpt_log(CKPT_LOG_ERR, "%s: profile '%s' not found in the shared credentials or config file",
			 s->base.root, prof);
		rc = -EINVAL;
		goto out;
	}
	s->auth = AUTH_NONE;
	ckpt_log(CKPT_LOG_INFO, "%s: no credentials found: anonymous requests", s->base.root);
out:
	free(cred);
	free(conf);
	return rc;
}

/* Linux on Google Compute Engine, the way Google's client libraries tell. */
static int on_gce(void)
{
	FILE *f = fopen("/sys/class/dmi/id/product_name", "r");
	char buf[128] = "";
	if (f) {
		if (!fgets(buf, sizeof(buf), f))
			buf[0] = 0;
		fclose(f);
	}
	return strstr(buf, "Google") != NULL;
}

/* Region and credentials of a new store (s3_int.h). */
int ckpt_s3_creds_setup(struct s3_store *s, const struct ckpt_store_opts *o)
{
	int rc;
	/* region */
	const char *reg = o->region;
	if (!reg && !s->gcs)
		reg = env_nonempty("AWS_REGION");
	if (!reg && !s->gcs)
		reg = env_nonempty("AWS_DEFAULT_REGION");
	if (reg && !(s->region = strdup(reg)))
		return -ENOMEM;

	/* credentials */
	int profile_region = 0;
	if (o->anonymous) {
		s->auth = AUTH_NONE;
	} else if (s->gcs && (o->token_file || env_nonempty("GOOGLE_OAUTH_ACCESS_TOKEN"))) {
		s->auth = AUTH_BEARER;
		if (o->token_file) {
			s->token_file = strdup(o->token_file);
			if (!s->token_file)
				return -ENOMEM;
			rc = ckpt_s3_bearer_refresh(s);
			if (rc)
				return rc;
		} else {
			s->bearer = strdup(env_nonempty("GOOGLE_OAUTH_ACCESS_TOKEN"));
		}
		ckpt_log(CKPT_LOG_INFO, "%s: OAuth2 bearer token from %s", s->base.root,
			 o->token_file ? "the token file" : "GOOGLE_OAUTH_ACCESS_TOKEN");
	} else {
		rc = find_creds(s, o->profile, &profile_region);
		if (rc)
			return rc;
		/* gs:// with nothing else on a Google Cloud machine: the metadata server */
		const char *mh = env_nonempty("GCE_METADATA_HOST");
		if (!mh)
			mh = env_nonempty("GCE_METADATA_ROOT");
		if (s->gcs && s->auth == AUTH_NONE && (mh || on_gce())) {
			if (asprintf(&s->meta_url,
				     "http://%s/computeMetadata/v1/instance/service-accounts/default/token",
				     mh ? mh : "metadata.google.internal") < 0) {
				s->meta_url = NULL;
				return -ENOMEM;
			}
			s->auth = AUTH_BEARER;
			ckpt_log(CKPT_LOG_INFO, "%s: OAuth2 bearer tokens from the metadata server",
				 s->base.root);
		}
	}
	if (!s->region && !(s->region = strdup(s->gcs ? "auto" : "us-east-1")))
		return -ENOMEM;
	return 0;
}
