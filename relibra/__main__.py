from relibra.cli import main

raise SystemExit(main())
