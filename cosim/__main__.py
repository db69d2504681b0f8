from cosim.cli import main

raise SystemExit(main())
