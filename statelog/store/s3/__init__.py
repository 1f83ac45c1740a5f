"""The object store on any S3-compatible server (``s3://bucket/prefix`` job roots), via ``minio``.

By role, bottom-up:

* :mod:`~statelog.store.s3.config`: :class:`S3Config`, the connection settings from the
  store options and the ``AWS_*`` environment (no minio import);
* :mod:`~statelog.store.s3.error_mapping`: S3 and HTTP failures as statelog errors that
  say what to do;
* :mod:`~statelog.store.s3.connection`: the HTTP pool and the minio client, the bucket
  check, every call with retries;
* :mod:`~statelog.store.s3.writes`: write-once ``put`` and the conditional ``put_if_absent``;
* :mod:`~statelog.store.s3.object_store`: :class:`S3ObjectStore`, reads, listing, deletes.

Secrets (secret key, session token) never appear in ``repr``, ``url``, logs or errors;
the access key is shown by its first four characters only. This package imports none of
its modules here, so resolving settings does not import minio.
"""
