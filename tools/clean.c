/*
 * clean.c - `nvio clean [--dry-run] [--spares[=all]] DIR`: removes the temporaries that
 * killed writers left in DIR (nvio_clean_temporaries), one line per
 * temporary found.
 */
#include "tool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char clean_help[] =
"Usage: nvio clean [OPTIONS] DIR\n"
"\n"
"Removes from DIR the temporaries of atomic writes (checkpoints, whole-file\n"
"writes) whose writer was killed: hidden files named\n"
"'.NAME.nvio-OWNER-PID-START-RANDOM'. One is removed only when its owner is\n"
"known dead: the process exited (its pid gone or another process's now), or\n"
"it ran in an earlier boot of this host. Temporaries of running writers, of\n"
"writers on other hosts or in other containers, of other users, and every\n"
"other file (links, directories, names of another form) are left alone.\n"
"Every ATOMIC write already removes its own target's; this command removes\n"
"every target's. Prints one line per temporary found: 'removed', 'would\n"
"remove' (--dry-run), 'kept' or 'failed', its name and why.\n"
"\n"
"Spares ('.NAME.nvio-spare', the previous versions kept by saves made with\n"
"NVIO_FILE_SPARE / spare=True so that the next save overwrites their blocks)\n"
"are removed only with --spares: those whose target NAME is gone, or every\n"
"one with --spares=all (each costs the size of its file on disk; the next\n"
"spare save makes a new one). A spare in use by a writer is kept.\n"
"\n"
"Options:\n"
"  -n, --dry-run   remove nothing, say what would be removed\n"
"  --any-user      also other users' temporaries (root)\n"
"  --spares[=all]  also spares whose target is gone (all: every spare)\n"
"  -h, --help      this text\n";

struct tally {
	int dry;
	int failed;
};

static void report(const char *name, int result, const char *why, void *arg)
{
	const struct tally *t = arg;
	const char *what = result > 0 ? (t->dry ? "would remove" : "removed") :
			   result == 0 ? "kept" : "failed";

	((struct tally *)arg)->failed += result < 0;
	printf("%-12s %s (%s)\n", what, name, why);
}

int cmd_clean(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dry-run", no_argument, 0, 'n' },
		{ "any-user", no_argument, 0, 'u' },
		{ "spares", optional_argument, 0, 's' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	struct tally t = { 0 };
	unsigned flags = 0;
	int c, r;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":hn", opts, NULL)) != -1) {
		if (c == 'h') {
			fputs(clean_help, stdout);
			return 0;
		} else if (c == 'n') {
			flags |= NVIO_CLEAN_DRY_RUN;
			t.dry = 1;
		} else if (c == 'u') {
			flags |= NVIO_CLEAN_ANY_USER;
		} else if (c == 's' && (!optarg || !strcmp(optarg, "all"))) {
			flags |= optarg ? NVIO_CLEAN_ALL_SPARES : NVIO_CLEAN_SPARES;
		} else if (c == 's') {
			usage_error("--spares takes no value or 'all'");
		} else {
			bad_option(argv, c);
		}
	}
	if (optind + 1 != argc)
		usage_error("give one directory");
	r = nvio_clean_temporaries(argv[optind], NULL, flags, report, &t);
	if (r < 0 && t.failed) {
		msg("%s: %d temporar%s could not be removed: %s", argv[optind], t.failed,
		    t.failed == 1 ? "y" : "ies", strerror(-r));
		return EXIT_RUNTIME;
	}
	if (r < 0) {
		msg("%s: %s", argv[optind], strerror(-r));
		return EXIT_RUNTIME;
	}
	printf("%d temporar%s %s in %s\n", r, r == 1 ? "y" : "ies",
	       t.dry ? "would be removed" : "removed", argv[optind]);
	return 0;
}
