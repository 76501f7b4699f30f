"""Print a greeting."""

import getpass


def main() -> None:
    print(f"hello, {getpass.getuser()}")


if __name__ == "__main__":
    main()
