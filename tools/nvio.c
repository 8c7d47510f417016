/*
 * nvio.c - the nvio command: dispatch to the subcommands.
 *
 * Uses only the public API of libnvio (include/nvio.h) and libc.
 * Exit status: 0 success, 1 runtime error, 2 usage error (see nvio(1)).
 */
#include "tool.h"

#include <stdlib.h>
#include <string.h>

struct subcommand {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

static const struct subcommand subcommands[] = {
	{ "report", cmd_report, "what this machine and a directory support" },
	{ "bench", cmd_bench, "read/write bandwidth between memory and files" },
	{ "tune", cmd_tune, "find and save the best handle configuration" },
	{ "clean", cmd_clean, "remove temporaries that killed writers left" },
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: nvio COMMAND [OPTIONS]\n\n"
		"Moves bytes between memory and files at device speed "
		"(libnvio %s).\n\nCommands:\n", nvio_version_string());
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(*subcommands); i++)
		fprintf(f, "  %-8s %s\n", subcommands[i].name,
			subcommands[i].summary);
	fprintf(f, "\n'nvio COMMAND --help' describes each command; "
		"see also nvio(1).\n"
		"Options: --help, --version\n");
}

int main(int argc, char **argv)
{
	static char prog[64];

	atexit(stdout_check_at_exit);
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
	    !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		printf("nvio %s\n", nvio_version_string());
		return 0;
	}
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(*subcommands); i++) {
		if (strcmp(argv[1], subcommands[i].name))
			continue;
		snprintf(prog, sizeof(prog), "nvio %s", subcommands[i].name);
		tool_prog = prog;
		return subcommands[i].run(argc - 1, argv + 1);
	}
	fprintf(stderr, "nvio: unknown command '%s' (see 'nvio --help')\n",
		argv[1]);
	return EXIT_USAGE;
}
