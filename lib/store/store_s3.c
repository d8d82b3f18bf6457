/*
 * store_s3.c - object stores (s3://, gs://).  Placeholder: not built yet.
 */
#include "common.h"
#include "store_int.h"

int ckpt_store_s3_open(const char *source, const struct ckpt_store_opts *o, ckpt_store **out)
{
	(void)source;
	(void)o;
	*out = NULL;
	ckpt_log(CKPT_LOG_ERR, "object stores are not supported by this build");
	return -ENOTSUP;
}
